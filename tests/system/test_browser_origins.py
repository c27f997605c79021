"""Browsers anywhere: a page on another origin streams a job from the URL a backend received.

The "backend" is the test: it submits with the API key and hands the page ``urls.stream`` or
``urls.ws``. The page, served by a plain ``http.server`` on another port (another origin), opens
it with ``EventSource`` or ``WebSocket`` and never sees a key. The web tier is a real gunicorn
with API keys and ``TRICKLE__WEB__CORS_ORIGINS`` naming that origin, on the shared worker.
Chromium and its fixtures are ``tests/system/test_browser.py``'s.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from playwright.sync_api import Page

from ops.redis_server import free_port
from tests import stack
from tests.system import test_browser as shared

browser = shared.browser  # the same Chromium fixtures, not a copy
page = shared.page
pytestmark = pytest.mark.timeout(120)

KEY = "cross-origin-backend-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
STATUS_ORDER = ["queued", "running", "succeeded", "failed", "canceled"]

# The whole "other site": opens the URL it is given and renders what arrives.
WATCH_HTML = """<!doctype html>
<meta charset="utf-8"><title>another origin</title>
<pre id="out" data-state="idle"></pre><p id="error"></p>
<script>
const url = new URLSearchParams(location.search).get("url");
const out = document.getElementById("out");
window.indexes = []; window.statuses = []; window.job = null;
const token = (event) => {
  // A WebSocket frame is a run of `count` tokens from `index`; an SSE event is one token.
  for (let i = 0; i < (event.count || 1); i++) window.indexes.push(event.index + i);
  out.textContent += event.text;
};
const status = (event) => window.statuses.push(event.status);
const done = (job) => { window.job = job; out.dataset.state = "final"; };
async function failed() {
  // EventSource and WebSocket hide the HTTP answer: the job URL, same token, says why.
  const jobUrl = url.replace(/\\/(events|ws)\\?/, "?").replace(/^ws/, "http");
  try {
    const response = await fetch(jobUrl);
    const body = await response.json();
    document.getElementById("error").textContent = `${response.status} ${body.error.message}`;
  } catch (error) {
    document.getElementById("error").textContent = `unreadable answer: ${error}`;
  }
  out.dataset.state = "error";
}
if (url.startsWith("ws")) {
  const socket = new WebSocket(url);
  socket.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.event === "token") token(event);
    else if (event.event === "status") status(event);
    else if (event.event === "done") { done(event.job); socket.close(); }
  };
  socket.onclose = () => { if (!window.job) failed(); };
} else {
  const source = new EventSource(url);
  source.addEventListener("token", (event) => token(JSON.parse(event.data)));
  source.addEventListener("status", (event) => status(JSON.parse(event.data)));
  source.addEventListener("done", (event) => { source.close(); done(JSON.parse(event.data)); });
  source.onerror = () => { source.close(); if (!window.job) failed(); };
}
</script>
"""


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Another origin: a tiny static server on another port."""
    root = tmp_path_factory.mktemp("elsewhere")
    (root / "watch.html").write_text(WATCH_HTML)
    (root / "blank.html").write_text('<!doctype html><meta charset="utf-8"><title>blank</title>')
    handler = functools.partial(QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def api_url(config_path: Path, log_dir: Path, stack_url: str, page_origin: str) -> Iterator[str]:
    """The API with keys required and CORS for the page's origin (both from the environment)."""
    port = free_port()
    env = {"TRICKLE_API_KEYS": KEY, "TRICKLE__WEB__CORS_ORIGINS": page_origin}
    process = stack.start_web(config_path, port, log_dir, extra_env=env, name="web-origins")
    yield f"http://127.0.0.1:{port}"
    stack.stop(process)


def backend_submit(api_url: str, **body: Any) -> dict[str, Any]:
    body = {"prompt": "The socket module", "temperature": 0, **body}
    response = requests.post(f"{api_url}/v1/jobs", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 202, response.text
    return dict(response.json())


def stored(api_url: str, job_id: str) -> dict[str, Any]:
    return dict(requests.get(f"{api_url}/v1/jobs/{job_id}", headers=AUTH, timeout=10).json())


def open_elsewhere(page: Page, page_origin: str, stream_url: str) -> None:
    page.goto(f"{page_origin}/watch.html?url={quote(stream_url, safe='')}")


def assert_in_order(statuses: list[str]) -> None:
    """Each status once, in the order a job can go through them (a queued job's refreshes,
    every second while it waits, repeat "queued": one status)."""
    once = [s for i, s in enumerate(statuses) if i == 0 or s != "queued" or statuses[i - 1] != s]
    ranks = [STATUS_ORDER.index(status) for status in once]
    assert ranks == sorted(set(ranks)), statuses


@pytest.mark.parametrize("transport", ["stream", "ws"])
def test_a_page_on_another_origin_streams_every_token_from_the_url_alone(
    page: Page, api_url: str, page_origin: str, transport: str
) -> None:
    job = backend_submit(api_url, max_tokens=300, ignore_eos=True)
    assert KEY not in job["urls"][transport]
    open_elsewhere(page, page_origin, job["urls"][transport])
    page.wait_for_selector("#out[data-state='final']", state="attached", timeout=90_000)

    final = stored(api_url, job["id"])
    assert final["status"] == "succeeded"
    assert page.eval_on_selector("#out", "el => el.textContent") == final["output"]
    assert page.evaluate("window.indexes") == list(range(300))  # each once, in order
    statuses = page.evaluate("window.statuses")
    assert statuses[-1] == "succeeded"
    assert_in_order(statuses)


def test_a_wrong_token_shows_an_error(page: Page, api_url: str, page_origin: str) -> None:
    job = backend_submit(api_url, max_tokens=20)
    forged = job["urls"]["stream"].split("?token=")[0] + "?token=4102444800.forged"
    open_elsewhere(page, page_origin, forged)
    page.wait_for_selector("#out[data-state='error']", state="attached")
    assert "401" in page.inner_text("#error")
    assert "stream token" in page.inner_text("#error")
    assert page.evaluate("window.indexes") == []


def test_status_events_arrive_in_order(page: Page, api_url: str, page_origin: str) -> None:
    job = backend_submit(api_url, model="late", max_tokens=20)  # no worker: it waits
    open_elsewhere(page, page_origin, job["urls"]["stream"])
    page.wait_for_function("window.statuses.length >= 1")
    assert page.evaluate("window.statuses") == ["queued"]
    canceled = requests.post(job["urls"]["cancel"], headers=AUTH, timeout=10)
    assert canceled.status_code == 200
    page.wait_for_selector("#out[data-state='final']", state="attached")
    assert page.evaluate("window.statuses") == ["queued", "canceled"]
    assert page.evaluate("window.job.status") == "canceled"


def test_the_built_in_page_watches_any_job_and_resumes_after_a_drop(
    page: Page, api_url: str
) -> None:
    proxy = shared.DroppingProxy(api_url)
    try:
        job = backend_submit(api_url, max_tokens=400, ignore_eos=True)
        token = job["urls"]["stream"].split("?token=")[1]
        page.goto(f"{proxy.url}/?job={job['id']}&token={token}")
        page.wait_for_selector(shared.FINAL, timeout=90_000)
        assert proxy.cuts == 1
        data = shared.attributes(page)
        assert data["jobId"] == job["id"]
        assert int(data["reconnects"]) >= 1 and data["duplicates"] == "0"
        final = stored(api_url, job["id"])
        assert page.eval_on_selector("#output", "el => el.textContent") == final["output"]
        assert int(data["tokens"]) == final["usage"]["completion_tokens"] == 400
        assert page.inner_text("#status") == "succeeded"
        assert data["statuses"].split()[-1] == "succeeded"
        assert page.is_disabled("#stop-button")  # a stream token cannot cancel
        assert page.evaluate("localStorage.getItem('trickle.apiKey')") is None
    finally:
        proxy.close()


def test_the_built_in_page_shows_a_wrong_token(page: Page, api_url: str) -> None:
    job = backend_submit(api_url, max_tokens=20)
    page.goto(f"{api_url}/?job={job['id']}&token=1.wrong")
    page.wait_for_selector("#form-error:not([hidden])")
    assert "stream token" in page.inner_text("#form-error")
    assert page.get_attribute("#status", "data-status") == "error"


# A page elsewhere calls the API with its own key (a test's shortcut) and a deadline, then reads
# the answer's hops twice: the Server-Timing header and its Resource Timing entry.
FETCH_WITH_HOPS = """async ([url, key]) => {
  const response = await fetch(url, {
    method: "POST",
    headers: {
      "Authorization": `Bearer ${key}`, "Content-Type": "application/json",
      "Prefer": "wait=60", "Cancel-After": "60s",
    },
    body: JSON.stringify({prompt: "The", max_tokens: 4}),
  });
  const job = await response.json();
  const entry = performance.getEntriesByName(url).pop();
  return {
    status: response.status, job, header: response.headers.get("Server-Timing"),
    timings: entry.serverTiming.map((timing) => timing.name),
  };
}"""


def test_a_page_on_another_origin_reads_the_hops_of_its_answer(
    page: Page, api_url: str, page_origin: str
) -> None:
    page.goto(f"{page_origin}/blank.html")
    seen = page.evaluate(FETCH_WITH_HOPS, [f"{api_url}/v1/jobs", KEY])
    assert seen["status"] == 200 and seen["job"]["status"] == "succeeded", seen
    assert seen["job"]["deadline"] is not None  # Cancel-After passed the preflight
    header = seen["header"] or ""
    hops = [part.split(";")[0].strip() for part in header.split(",")]
    assert {"queue", "generate"} <= set(hops), header
    assert seen["timings"] == hops  # Timing-Allow-Origin: the page's timing API sees them too
