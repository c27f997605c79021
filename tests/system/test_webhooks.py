"""Job-completion webhooks: delivered signed to allowlisted hosts only, retried on failure."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from tests.clients import submit

SECRET = "test-secret"


class Receiver:
    """A real HTTP server on 127.0.0.1 that records deliveries and fails the first N."""

    def __init__(self, fail_first: int = 0):
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        self.times: list[float] = []
        self.fail_first = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.deliveries.append((dict(self.headers), body))
                receiver.times.append(time.monotonic())
                status = 500 if len(receiver.deliveries) <= receiver.fail_first else 204
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/trickle"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.deliveries) < count:
            assert time.monotonic() < deadline, f"only {len(self.deliveries)} deliveries"
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def verify(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    expected = hmac.new(
        SECRET.encode(), headers["X-Trickle-Timestamp"].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    assert headers["X-Trickle-Signature"] == f"sha256={expected}"
    assert headers["X-Trickle-Event"] == "job.finished"
    return json.loads(body)  # type: ignore[no-any-return]


def test_finished_job_is_posted_signed(stack_url: str, receiver: Receiver) -> None:
    job = submit(stack_url, {"prompt": "The", "max_tokens": 6, "webhook_url": receiver.url})
    receiver.wait_for(1)
    delivered = verify(*receiver.deliveries[0])
    assert delivered["id"] == job["id"]
    assert delivered["status"] == "succeeded"
    assert delivered["usage"]["completion_tokens"] >= 1


def test_failed_delivery_is_retried(stack_url: str) -> None:
    receiver = Receiver(fail_first=1)
    try:
        job = submit(stack_url, {"prompt": "The", "max_tokens": 4, "webhook_url": receiver.url})
        receiver.wait_for(2)
        assert [verify(*d)["id"] for d in receiver.deliveries] == [job["id"], job["id"]]
    finally:
        receiver.close()


def test_a_receiver_that_always_fails_gets_max_attempts_then_nothing(stack_url: str) -> None:
    receiver = Receiver(fail_first=10**6)
    try:
        submit(stack_url, {"prompt": "The", "max_tokens": 2, "webhook_url": receiver.url})
        receiver.wait_for(3)  # max_attempts = 3 in the test config; backoff 0-1 s, then 0-2 s
        time.sleep(4.5)  # a fourth attempt would have come by now (jittered backoff <= 4 s)
        assert len(receiver.deliveries) == 3
        print(
            "webhook attempts at +%s s" % [round(t - receiver.times[0], 2) for t in receiver.times]
        )
    finally:
        receiver.close()


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5/hook",
        "http://metadata.google.internal/computeMetadata",
        "file:///etc/passwd",
        "http://user:pw@127.0.0.1/hook",
        "not a url",
    ],
)
def test_urls_outside_the_allowlist_are_refused(stack_url: str, url: str) -> None:
    response = requests.post(
        f"{stack_url}/v1/jobs", json={"prompt": "x", "webhook_url": url}, timeout=10
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "webhook_url"
