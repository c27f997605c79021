"""The browser page (``GET /``) in a real headless Chromium driven by Playwright, on the real stack.

What a person sees: the answer grows token by token (several distinct lengths on screen before
``done``), the final text equals the stored ``output``, Stop cancels a running job, API errors
land next to their field, and a network drop mid-stream (a proxy between browser and server cuts
the stream) resumes with no text lost or repeated, over SSE (EventSource), WebSocket and, with an
API key, SSE over fetch().

Needs Debian's ``chromium`` (``playwright install`` cannot download here), found on PATH or at
/usr/bin/chromium. Without it the tests are skipped, saying so, except in CI (``CI`` set, as
``.ci/run`` does after installing it), where a missing browser fails them instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from playwright.sync_api import Browser, Page, sync_playwright

from ops.redis_server import free_port
from tests import stack
from tests.faultstack import build_slow_demo_stack

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
API_KEY = "browser-test-key"
FINAL = "#output[data-state='final']"

# Real processes started per test: a longer ceiling than the suite's 60 s.
pytestmark = pytest.mark.timeout(120)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return str(DEBIAN_CHROMIUM) if DEBIAN_CHROMIUM.exists() else None


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    found = find_chromium()
    if found is None:
        message = "no chromium on PATH or at /usr/bin/chromium: apt-get install chromium"
        if in_ci():
            pytest.fail(f"{message} (CI must run the browser tests)")
        pytest.skip(message)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=found, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh profile (empty localStorage) per test, light scheme, retina-sharp screenshots."""
    context = browser.new_context(
        viewport={"width": 1280, "height": 820}, device_scale_factor=2, color_scheme="light"
    )
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    yield tab
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


class DroppingProxy:
    """A TCP proxy in front of the web tier that cuts the first token stream (SSE or WebSocket)
    after ``cut_after`` bytes of its response: a network drop mid-stream, wherever the cut
    falls (mid-event, mid-character), however fast the model generates."""

    # A WebSocket frame carries every token that arrived together, so 400 tokens can take under
    # 4 kB on the wire: cut early enough to fall mid-stream on either transport.
    def __init__(self, target: str, cut_after: int = 1200) -> None:
        host, _, port = target.removeprefix("http://").partition(":")
        self.target = (host, int(port))
        self.cut_after = cut_after
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.lock = threading.Lock()
        self.sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            with self.lock:
                self.sockets |= {client, upstream}
            armed = threading.Event()  # this connection now carries the stream to cut
            threading.Thread(
                target=self._upload, args=(client, upstream, armed), daemon=True
            ).start()
            threading.Thread(
                target=self._download, args=(upstream, client, armed), daemon=True
            ).start()

    def _upload(
        self, client: socket.socket, upstream: socket.socket, armed: threading.Event
    ) -> None:
        try:
            while data := client.recv(65536):
                line = data.split(b"\r\n", 1)[0]
                if line.startswith(b"GET /v1/jobs/") and (b"/events" in line or b"/ws" in line):
                    with self.lock:
                        if self.cuts == 0:
                            self.cuts = 1
                            armed.set()
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            self._cut(client, upstream)

    def _download(
        self, upstream: socket.socket, client: socket.socket, armed: threading.Event
    ) -> None:
        sent = 0
        try:
            while data := upstream.recv(65536):
                if armed.is_set():
                    room = self.cut_after - sent
                    if len(data) >= room:
                        client.sendall(data[:room])
                        break
                    sent += len(data)
                client.sendall(data)
        except OSError:
            pass
        finally:
            self._cut(upstream, client)

    def _cut(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            with self.lock:
                self.sockets.discard(sock)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            sockets = list(self.sockets)
        self._cut(*sockets)


@pytest.fixture
def proxy(stack_url: str) -> Iterator[DroppingProxy]:
    dropping = DroppingProxy(stack_url)
    yield dropping
    dropping.close()


@pytest.fixture(scope="module")
def keyed_url(config_path: Path, log_dir: Path, stack_url: str) -> Iterator[str]:
    """A second web tier on the same Redis and worker, with API keys required."""
    keyed = config_path.with_name("keyed.toml")
    keyed.write_text(config_path.read_text() + f'\n[auth]\napi_keys = ["{API_KEY}"]\n')
    port = free_port()
    process = stack.start_web(keyed, port, log_dir)
    yield f"http://127.0.0.1:{port}"
    stack.stop(process)


@pytest.fixture(scope="module")
def slow_url(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[str]:
    """Where a 400-token answer grows visibly and a 1,024-token one can be stopped mid-way."""
    root = tmp_path_factory.mktemp("browser-slow")
    limits = "[limits]\nmax_tokens_ceiling = 1024\n"
    faults = build_slow_demo_stack(root, demo_model_dir / "tokenizer.model", limits)
    yield faults.web_url
    faults.close()


def open_page(page: Page, url: str) -> None:
    page.goto(url + "/")
    page.wait_for_selector("#model option[value='demo']", state="attached")


def fill_form(
    page: Page, prompt: str, max_tokens: int, seed: int | None = None, model: str = "demo"
) -> None:
    page.select_option("#model", model)
    page.fill("#prompt", prompt)
    page.fill("#max_tokens", str(max_tokens))
    page.fill("#seed", "" if seed is None else str(seed))
    page.check("#ignore_eos")


def record_lengths(page: Page) -> None:
    """Every DOM change of the output, as the text length right after it."""
    page.evaluate(
        """() => {
            const output = document.getElementById("output");
            window.lengths = [];
            new MutationObserver(() => window.lengths.push(output.textContent.length))
                .observe(output, {childList: true, characterData: true, subtree: true});
        }"""
    )


def wait_for_tokens(page: Page, count: int) -> int:
    page.wait_for_function(
        f"Number(document.querySelector('#output').dataset.tokens) >= {count}", polling=10
    )
    return int(page.get_attribute("#output", "data-tokens") or 0)


def attributes(page: Page) -> dict[str, str]:
    return dict(page.eval_on_selector("#output", "el => ({...el.dataset})"))


def stored_job(url: str, job_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = requests.get(f"{url}/v1/jobs/{job_id}", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def assert_exactly_once(page: Page, url: str, headers: dict[str, str] | None = None) -> None:
    """The text on screen is the stored output, one token event per generated token."""
    data = attributes(page)
    job = stored_job(url, data["jobId"], headers)
    assert job["status"] == "succeeded"
    assert page.inner_text("#status") == "succeeded"
    assert page.eval_on_selector("#output", "el => el.textContent") == job["output"]
    assert "mismatch" not in data
    assert int(data["tokens"]) == job["usage"]["completion_tokens"]


def test_answer_streams_token_by_token_and_ends_as_the_stored_output(
    page: Page, slow_url: str
) -> None:
    open_page(page, slow_url)
    assert page.get_attribute("#output", "data-state") == "idle"
    # The slow model: on the demo one, 600 tokens can land within two frames.
    fill_form(page, "The socket module", max_tokens=400, seed=7)
    record_lengths(page)
    page.focus("#prompt")
    page.keyboard.press("Control+Enter")

    page.wait_for_selector("#output.streaming")  # provisional while it grows
    page.wait_for_selector(FINAL, timeout=90_000)

    final = page.eval_on_selector("#output", "el => el.textContent")
    lengths: list[int] = page.evaluate("window.lengths")
    intermediate = {length for length in lengths if 0 < length < len(final)}
    assert len(intermediate) >= 3, f"the text never visibly grew: {lengths}"
    data = attributes(page)
    assert int(data["renders"]) >= 3
    assert data["tokens"] == "400"
    assert data["reconnects"] == data["duplicates"] == "0"
    assert_exactly_once(page, slow_url)
    assert page.get_attribute("#output", "class") == "output final"
    assert page.inner_text("#stat-ttft").endswith(("ms", "s"))
    assert page.inner_text("#stat-rate") != "—"
    assert page.is_enabled("#generate") and not page.is_enabled("#stop-button")

    (ROOT / "artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "artifacts" / "browser.png"))


@pytest.mark.both_models
def test_the_served_model_streams_into_the_page_exactly(
    page: Page, stack_url: str, served_model: str
) -> None:
    """The page on the served model (SmolLM2's byte-level BPE too): the text shown is the
    stored output, one event per token, no duplicate."""
    open_page(page, stack_url)
    page.wait_for_selector(f"#model option[value='{served_model}']", state="attached")
    fill_form(page, "The capital of France is", max_tokens=24, seed=7, model=served_model)
    page.click("#generate")
    page.wait_for_selector(FINAL, timeout=120_000)
    data = attributes(page)
    assert data["tokens"] == "24" and data["duplicates"] == "0"
    assert_exactly_once(page, stack_url)


def test_stop_cancels_a_running_job(page: Page, slow_url: str) -> None:
    open_page(page, slow_url)
    # On the slow model 1024 tokens run far longer than a click.
    fill_form(page, "Return the", max_tokens=1024, seed=3)
    page.click("#generate")
    shown = wait_for_tokens(page, 20)
    assert page.get_attribute("#output", "data-state") == "streaming"
    assert page.eval_on_selector("#output", "el => getComputedStyle(el).fontStyle") == "italic"
    page.click("#stop-button")

    page.wait_for_selector(FINAL)
    assert page.inner_text("#status") == "canceled"
    data = attributes(page)
    job = stored_job(slow_url, data["jobId"])
    assert job["status"] == "canceled"
    assert job["finish_reason"] == "canceled"
    assert shown <= int(data["tokens"]) < 1024
    assert page.eval_on_selector("#output", "el => el.textContent") == job["output"]
    assert "mismatch" not in data


def test_queued_job_shows_queued_and_stop_cancels_it(page: Page, stack_url: str) -> None:
    open_page(page, stack_url)
    page.select_option("#model", "late")  # no worker serves it: the job stays queued
    page.fill("#prompt", "Hello")
    page.click("#generate")
    page.wait_for_selector("#status[data-status='queued']")
    page.click("#stop-button")

    page.wait_for_selector(FINAL)
    assert page.inner_text("#status") == "canceled"
    job = stored_job(stack_url, attributes(page)["jobId"])
    assert job["status"] == "canceled"
    assert job["output"] == "" == page.eval_on_selector("#output", "el => el.textContent")


def test_a_job_not_started_by_its_deadline_ends_expired_and_says_why(
    page: Page, stack_url: str
) -> None:
    # The page sends no deadline of its own: the request gets one on its way out.
    def with_deadline(route: Any) -> None:
        if route.request.method != "POST":
            route.continue_()
            return
        route.continue_(headers={**route.request.headers, "cancel-after": "1s"})

    page.route("**/v1/jobs", with_deadline)
    open_page(page, stack_url)
    page.select_option("#model", "late")  # no worker serves it: only the deadline ends it
    page.fill("#prompt", "Hello")
    page.click("#generate")
    page.wait_for_selector("#status[data-status='queued']")

    page.wait_for_selector(FINAL)
    assert page.inner_text("#status") == "expired"
    job = stored_job(stack_url, attributes(page)["jobId"])
    assert job["status"] == "expired"
    meta = page.inner_text("#meta")
    assert f"Expired: {job['error']['message']}" in meta
    assert "error" in (page.get_attribute("#meta", "class") or "")
    assert page.is_disabled("#stop-button") and not page.is_disabled("#generate")


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_network_drop_mid_stream_resumes_without_gap_or_duplicate(
    page: Page, proxy: DroppingProxy, transport: str
) -> None:
    open_page(page, proxy.url)
    fill_form(page, "The socket module", max_tokens=400)
    page.click(f"label[for='transport-{transport}']")
    assert page.is_checked(f"#transport-{transport}")
    page.click("#generate")

    page.wait_for_selector(FINAL, timeout=90_000)
    assert proxy.cuts == 1
    data = attributes(page)
    assert data["transport"] == transport
    assert int(data["reconnects"]) >= 1
    assert data["duplicates"] == "0"  # it resumed after the last index it had shown
    assert_exactly_once(page, proxy.url)


def test_api_key_is_asked_for_kept_and_sent_and_streams_resume_over_fetch(
    page: Page, keyed_url: str
) -> None:
    keyed_proxy = DroppingProxy(keyed_url)
    try:
        page.goto(keyed_proxy.url + "/")
        page.wait_for_selector("#key-panel:not([hidden])")
        assert "needs an API key" in page.inner_text("#key-note")
        assert "API key" in page.inner_text("#form-error")

        page.fill("#api-key", API_KEY)
        page.press("#api-key", "Enter")
        page.wait_for_selector("#model option[value='demo']", state="attached")
        assert page.evaluate("localStorage.getItem('trickle.apiKey')") == API_KEY
        assert page.is_disabled("#transport-ws")  # no Authorization header on a WebSocket

        fill_form(page, "Return the", max_tokens=400)
        page.click("#generate")
        page.wait_for_selector(FINAL, timeout=90_000)
        assert keyed_proxy.cuts == 1
        assert int(page.get_attribute("#output", "data-reconnects") or 0) >= 1
        assert page.get_attribute("#output", "data-duplicates") == "0"
        assert_exactly_once(page, keyed_url, {"Authorization": f"Bearer {API_KEY}"})
    finally:
        keyed_proxy.close()


def test_api_errors_are_shown_next_to_the_field(page: Page, stack_url: str) -> None:
    open_page(page, stack_url)
    fill_form(page, "Return the", max_tokens=32)
    page.fill("#temperature", "5")
    page.click("#generate")
    page.wait_for_selector("#form-error:not([hidden])")
    assert "temperature" in page.inner_text("#form-error")
    assert page.get_attribute("#temperature", "aria-invalid") == "true"
    assert "temperature" in page.inner_text("#temperature-error")
    assert page.get_attribute("#output", "data-state") == "idle"  # nothing was submitted


def test_docs_screenshot(page: Page, stack_url: str) -> None:
    """docs/screenshot.png: a finished answer with the whole form in view."""
    page.set_viewport_size({"width": 1280, "height": 980})
    open_page(page, stack_url)
    fill_form(page, "The socket module", max_tokens=250)
    page.click("#generate")
    page.wait_for_selector(FINAL, timeout=60_000)
    assert_exactly_once(page, stack_url)
    page.evaluate("window.scrollTo(0, 0)")
    (ROOT / "artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "artifacts" / "finished.png"))
    if os.environ.get("TRICKLE_UPDATE_SCREENSHOT") == "1":
        # The README's picture; refreshed on request only, so test runs leave the tree clean.
        page.screenshot(path=str(ROOT / "docs" / "screenshot.png"))
