"""The outside audit's twelve reproductions, one test each, on the real stack (gunicorn, worker,
Redis): every one answers a 4xx JSON error or the documented behaviour, never a 5xx, an HTML
page or a leaked subscription."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket
from flask import Flask

from tests.clients import batch_line, batch_read_in, jsonl, poll_until_finished, submit
from tests.faultstack import wait_for
from tests.metrics_text import scrape
from tests.server_log import server_faults
from trickle.config.settings import Settings
from web.services import services

DEEP = b"[" * 100_000
HUGE_INTEGER = b"1" * 5_000


def active_streams(base: str) -> float:
    return scrape(base)["trickle_active_streams{}"]


def settle_streams(base: str, baseline: float, timeout: float = 10) -> float:
    """The gauge once it is back to ``baseline`` (or its value at the deadline)."""
    deadline = time.monotonic() + timeout
    while (value := active_streams(base)) != baseline and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def error_of(response: requests.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text[:300]
    assert response.headers["Content-Type"].startswith("application/json"), response.text[:300]
    return response.json()["error"]  # type: ignore[no-any-return]


def chunked(data: bytes, size: int = 65_536) -> Iterator[bytes]:
    """A generator body: requests sends it with Transfer-Encoding: chunked, no Content-Length."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.fixture(scope="module")
def finished_job(stack_url: str) -> dict[str, Any]:
    return poll_until_finished(
        stack_url, submit(stack_url, {"prompt": "The", "max_tokens": 3})["id"]
    )


# 1 -------------------------------------------------------------------------------------------


def test_streams_of_ids_that_fail_their_first_read_leak_no_subscription(
    stack_url: str, finished_job: dict[str, Any]
) -> None:
    baseline = active_streams(stack_url)
    base = f"{stack_url}/v1/jobs/{finished_job['id']}:tokens"
    for _ in range(40):
        error_of(requests.get(f"{base}/events", timeout=10), 404)
        ws = websocket.create_connection(base.replace("http://", "ws://") + "/ws", timeout=10)
        assert json.loads(ws.recv())["event"] == "error"
        ws.close()
    assert settle_streams(stack_url, baseline) == baseline


# 2 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    "payload", [DEEP, HUGE_INTEGER, b'{"prompt": "x", "seed": 1' + b"0" * 5000 + b"}"]
)
def test_deep_nesting_and_huge_numbers_are_400(stack_url: str, route: str, payload: bytes) -> None:
    error = error_of(requests.post(f"{stack_url}{route}", data=payload[:60_000], timeout=30), 400)
    assert error["param"] == "body"


@pytest.mark.parametrize("line", [DEEP[:50_000], HUGE_INTEGER])
def test_deep_or_huge_batch_line_is_400_naming_the_line(stack_url: str, line: bytes) -> None:
    error = error_of(requests.post(f"{stack_url}/v1/batches", data=line, timeout=30), 400)
    assert error["param"] == "line 1"


# 3 -------------------------------------------------------------------------------------------


def test_chunked_body_over_the_limit_is_413_never_truncated(stack_url: str) -> None:
    body = json.dumps({"prompt": "x" * 70_000}).encode()  # the stack's limit is 64 KiB
    for data in (body, chunked(body)):
        error = error_of(requests.post(f"{stack_url}/v1/jobs", data=data, timeout=30), 413)
        assert error["type"] == "request_too_large"


def test_chunked_batch_over_the_limit_is_413(stack_url: str) -> None:
    line = jsonl([batch_line()])
    lines = [jsonl([batch_line(f"r{i}")]) for i in range(16_777_216 // len(line) + 10)]
    data = b"".join(lines)
    assert len(data) > 16_777_216
    response = requests.post(f"{stack_url}/v1/batches", data=chunked(data), timeout=120)
    assert error_of(response, 413)["type"] == "request_too_large"
    small = b"".join(lines[:20])  # under the limit, in odd-sized chunks: every line counts
    response = requests.post(f"{stack_url}/v1/batches", data=chunked(small, 7), timeout=30)
    assert response.status_code == 200, response.text
    assert batch_read_in(stack_url, response.json()["id"])["request_counts"]["total"] == 20
    requests.post(f"{stack_url}/v1/batches/{response.json()['id']}/cancel", timeout=30)


# 4 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b'{"custom_id": "\\ud800", "method": "POST", "url": "/v1/completions", "body": {}}',
        b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"\\udfff": 1}}',
    ],
)
def test_lone_surrogates_anywhere_are_400_at_submission(stack_url: str, line: bytes) -> None:
    error = error_of(requests.post(f"{stack_url}/v1/batches", data=line, timeout=30), 400)
    assert "surrogate" in error["message"]
    error = error_of(requests.post(f"{stack_url}/v1/jobs", data=line, timeout=30), 400)
    assert "surrogate" in error["message"]


# 5 -------------------------------------------------------------------------------------------


def test_malformed_ids_are_404_before_any_redis_call(
    stack_url: str, finished_job: dict[str, Any]
) -> None:
    batch = requests.post(f"{stack_url}/v1/batches", data=jsonl([batch_line()]), timeout=30)
    assert batch.status_code == 200, batch.text
    batch_id = batch.json()["id"]
    for path in (
        f"/v1/jobs/{finished_job['id']}:tokens",
        f"/v1/jobs/{finished_job['id']}:lease",
        f"/v1/batches/{batch_id}:items",
        f"/v1/batches/{batch_id}:items/output",
    ):
        error = error_of(requests.get(f"{stack_url}{path}", timeout=10), 404)
        assert "WRONGTYPE" not in error["message"] and "trickle:" not in error["message"]
    cancel = requests.post(f"{stack_url}/v1/jobs/{finished_job['id']}:tokens/cancel", timeout=10)
    error_of(cancel, 404)


# 6 -------------------------------------------------------------------------------------------


def test_a_canceled_job_is_counted_once_however_often_it_is_canceled(stack_url: str) -> None:
    series = 'trickle_jobs_total{model="late",status="canceled"}'
    before = scrape(stack_url).get(series, 0)
    job = submit(stack_url, {"prompt": "The", "model": "late"})  # no worker: stays queued
    for _ in range(26):
        response = requests.post(f"{stack_url}/v1/jobs/{job['id']}/cancel", timeout=10)
        assert response.status_code == 200 and response.json()["status"] == "canceled"
    assert scrape(stack_url)[series] == before + 1


# 7 -------------------------------------------------------------------------------------------


def ws_url(base: str, job_id: str, query: str = "") -> str:
    return base.replace("http://", "ws://") + f"/v1/jobs/{job_id}/ws{query}"


@pytest.mark.parametrize("query", ["?after=abc", "?after=-5"])
def test_websocket_bad_parameter_is_an_error_event_then_4400(
    stack_url: str, finished_job: dict[str, Any], query: str
) -> None:
    ws = websocket.create_connection(ws_url(stack_url, finished_job["id"], query), timeout=10)
    message = json.loads(ws.recv())
    assert message["event"] == "error"
    assert message["error"]["param"] == "after"
    opcode, frame = ws.recv_data(control_frame=True)
    assert opcode == websocket.ABNF.OPCODE_CLOSE
    assert int.from_bytes(frame[:2], "big") == 4400
    ws.shutdown()


def test_websocket_clients_leaving_mid_stream_are_no_error(stack_url: str, log_dir: Path) -> None:
    log = log_dir / "web.log"
    start = log.stat().st_size
    baseline = active_streams(stack_url)
    for _ in range(5):
        job = submit(stack_url, {"prompt": "The", "max_tokens": 400, "ignore_eos": True})
        ws = websocket.create_connection(ws_url(stack_url, job["id"]), timeout=10)
        # Status events first (queued, running: at most one per change), then tokens.
        events = [json.loads(ws.recv())["event"]]
        while events[-1] == "status" and len(events) < 4:
            events.append(json.loads(ws.recv())["event"])
        assert events[-1] == "token", events  # leave mid-stream
        ws.shutdown()  # gone without a close frame
    assert settle_streams(stack_url, baseline) == baseline
    with log.open("rb") as fh:
        fh.seek(start)
        written = fh.read().decode("utf-8", "replace")
    assert server_faults(written) == []
    assert '/ws HTTP/1.1" 500' not in written


# 8 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:99999/",
        "http://127.0.0.1:abc/",
        "http://127.0.0.1:0/",
        "http://127.0.0.1/a path",
        "http://127.0.0.1/a\r\nX-Injected: 1",
        "http://[127.0.0.1]/",
        "http://[hooks.example.com]/",
        "http://127.0.0.1/caf\u00e9",
    ],
)
def test_bad_webhook_urls_are_400_at_submission(stack_url: str, url: str) -> None:
    body = {"prompt": "The", "max_tokens": 1, "webhook_url": url}
    response = requests.post(f"{stack_url}/v1/jobs", json=body, timeout=10)
    assert error_of(response, 400)["param"] == "webhook_url"


# 9, 10 (bounds) and the webhook address check: see the in-process tests at the end -----------
# 10 ------------------------------------------------------------------------------------------


def test_a_large_batch_is_accepted_fast(stack_url: str) -> None:
    lines = [batch_line(f"r{i}", prompt=["The", "A"], n=2) for i in range(250)]
    started = time.monotonic()
    response = requests.post(f"{stack_url}/v1/batches", data=jsonl(lines), timeout=120)
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    batch = response.json()
    assert batch_read_in(stack_url, batch["id"])["request_counts"]["total"] == 250
    requests.post(f"{stack_url}/v1/batches/{batch['id']}/cancel", timeout=60)
    assert elapsed < 5, f"1,000 jobs took {elapsed:.1f} s to accept"
    # Canceled jobs' messages stay in the queue (and count against its bound) until the worker
    # drains them: leave the shared stack's queue as this test found it.
    wait_for(lambda: queue_depth(stack_url) == 0, 90, "the canceled batch to drain")


def queue_depth(base: str) -> int:
    return int(requests.get(f"{base}/scaling/demo", timeout=10).json()["queue_depth"])


# 11 ------------------------------------------------------------------------------------------


def test_jsonl_splits_on_newlines_only_and_reads_any_content_type(stack_url: str) -> None:
    # Raw (unescaped) separators that str.splitlines() would have cut the line at.
    line = json.dumps(
        batch_line("sep", prompt="a\u2028b\u2029c\x85d\x0be\x1cf"), ensure_ascii=False
    )
    assert len(line.splitlines()) > 1
    for content_type in ("application/x-www-form-urlencoded", "text/plain", "application/jsonl"):
        response = requests.post(
            f"{stack_url}/v1/batches",
            data=(line + "\r\n").encode(),
            headers={"Content-Type": content_type},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        assert batch_read_in(stack_url, response.json()["id"])["request_counts"]["total"] == 1


# 12 ------------------------------------------------------------------------------------------


def raw_http(base: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65_536):
            received += chunk
            head, _, body = received.partition(b"\r\n\r\n")
            headers = dict(
                line.split(": ", 1)
                for line in head.decode("latin-1").split("\r\n")[1:]
                if ": " in line
            )
            length = headers.get("Content-Length")
            if length is not None and len(body) >= int(length):
                break
    status = int(head.split(b" ", 2)[1])
    return status, headers, body


def test_double_slash_is_a_json_404_never_a_redirect_from_host(
    stack_url: str, finished_job: dict[str, Any]
) -> None:
    path = f"/v1/jobs//{finished_job['id']}"
    status, headers, body = raw_http(
        stack_url,
        f"GET {path} HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n".encode(),
    )
    assert status == 404 and "Location" not in headers
    assert json.loads(body)["error"]["type"] == "not_found"


CHUNKED_POST = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", 431),
        (b"GARBAGE\r\n\r\n", 400),
        (CHUNKED_POST + b"zz\r\n\r\n", 400),  # a chunk size that is no number
        (CHUNKED_POST + b"2\r\n{}xx\r\n0\r\n\r\n", 400),  # a chunk longer than it says
    ],
)
def test_gunicorns_own_errors_are_json(stack_url: str, request_bytes: bytes, status: int) -> None:
    got, headers, body = raw_http(stack_url, request_bytes)
    assert got == status
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body)["error"]["message"]


# In-process apps on the test Redis, for what needs other settings than the stack's -----------


def test_a_stream_response_never_read_closes_its_subscription(
    stack_url: str, settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    # About subscriptions, not the queue bound, which other tests' backlogs may have reached.
    roomy = replace(settings, limits=replace(settings.limits, max_queued_jobs=1_000_000))
    app = make_app(roomy)
    client = app.test_client()
    long = {"max_tokens": 200, "ignore_eos": True}  # still running when the reader subscribes
    submitted = client.post("/v1/jobs", json={"prompt": "The", **long})
    assert submitted.status_code == 202, submitted.get_json()
    job = submitted.get_json()
    response = client.get(f"/v1/jobs/{job['id']}/events", buffered=False)
    assert response.status_code == 200
    assert services(app).hub.active_subscriptions == 1
    response.close()  # the client left before the body was iterated
    assert services(app).hub.active_subscriptions == 0
    threads = threading.active_count()  # the hub's listener included
    body = {"model": "demo", "prompt": ["The", "A", "It"], **long, "stream": True}
    response = client.post("/v1/completions", json=body, buffered=False)
    assert next(response.response)  # the stream started: one reader thread per prompt
    response.close()
    assert services(app).hub.active_subscriptions == 0
    deadline = time.monotonic() + 3 * settings.web.keepalive_seconds
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads


def test_an_idle_connection_outlives_the_clients_own_idle_expiry(stack_url: str) -> None:
    """httpx and the openai client reuse an idle connection for 5 s: the server keeps one
    longer, so it never closes one a client is reusing (which reset the request, unread).
    ``http.client`` keeps its one socket and never reconnects on its own: a close shows."""
    host, port = stack_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        sockets = []
        for pause in (0.0, 6.0):  # past the clients' 5 s, and past the server's old keep-alive
            time.sleep(pause)
            connection.request("GET", "/healthz")
            sockets.append(connection.sock)
            response = connection.getresponse()
            response.read()
            assert response.status == 200
        assert sockets[0] is sockets[1]  # one connection, reused: nothing reopened it
    finally:
        connection.close()
