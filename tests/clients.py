"""Minimal HTTP, SSE and WebSocket clients for the end-to-end tests."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests
import websocket


@dataclass
class StreamResult:
    tokens: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    comments: int = 0
    statuses: list[dict[str, Any]] = field(default_factory=list)  # status events, in order
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each token

    @property
    def text(self) -> str:
        return "".join(token["text"] for token in self.tokens)

    @property
    def token_count(self) -> int:
        return len(self.indexes)

    @property
    def indexes(self) -> list[int]:
        """Every token's index (a WebSocket run of ``count`` tokens stands for that many)."""
        return [
            token["index"] + offset
            for token in self.tokens
            for offset in range(token.get("count", 1))
        ]


class Deadline:
    """A total time limit for a stream, checked between messages."""

    def __init__(self, seconds: float, what: str):
        self._end = time.monotonic() + seconds
        self._seconds = seconds
        self._what = what

    def check(self, result: StreamResult) -> None:
        if time.monotonic() > self._end:
            raise AssertionError(
                f"{self._what} still open after {self._seconds}s ({len(result.tokens)} tokens)"
            )


def submit(base: str, body: dict[str, Any], wait: float | None = None) -> dict[str, Any]:
    headers = {"Prefer": f"wait={wait}"} if wait else {}
    response = requests.post(f"{base}/v1/jobs", json=body, headers=headers, timeout=90)
    assert response.status_code in (200, 202), response.text
    assert response.headers["Location"] == f"/v1/jobs/{response.json()['id']}"
    return response.json()  # type: ignore[no-any-return]


def get_job(base: str, job_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = requests.get(f"{base}/v1/jobs/{job_id}", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def poll_until_finished(
    base: str, job_id: str, timeout: float = 60, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = get_job(base, job_id, headers)
        if job["status"] in ("succeeded", "failed", "canceled"):
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['status']}"
        time.sleep(0.05)


def read_sse(
    base: str,
    job_id: str,
    headers: dict[str, str] | None = None,
    query: str = "",
    max_tokens: int | None = None,
    timeout: float = 60,
    opened: threading.Event | None = None,
    into: StreamResult | None = None,
) -> StreamResult:
    """Read an SSE stream to `done` (or stop early after max_tokens tokens).

    ``timeout`` bounds each read and the whole stream: keep-alive comments would otherwise keep
    a stream that never finishes open forever. ``opened`` is set once the headers arrived;
    ``into`` is filled as events arrive, for a test to watch from another thread.
    """
    result = into if into is not None else StreamResult()
    deadline = Deadline(timeout, f"SSE stream of {job_id}")
    url = f"{base}/v1/jobs/{job_id}/events{query}"
    with requests.get(url, headers=headers or {}, stream=True, timeout=timeout) as response:
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"] == "no-cache"
        assert response.headers["X-Accel-Buffering"] == "no"
        if opened is not None:
            opened.set()
        event: dict[str, str] = {}
        for raw in response.iter_lines(decode_unicode=False):
            deadline.check(result)
            line = raw.decode("utf-8")
            if line.startswith(":"):
                result.comments += 1
                continue
            if line:
                name, _, value = line.partition(": ")
                event[name] = value
                continue
            if event.get("event") == "token":
                data = json.loads(event["data"])
                assert event["id"] == str(data["index"])
                result.tokens.append(data)
                result.arrivals.append(time.monotonic())
                if max_tokens is not None and len(result.tokens) >= max_tokens:
                    return result
            elif event.get("event") == "status":
                assert "id" not in event  # Last-Event-ID stays the last token index
                result.statuses.append(json.loads(event["data"]))
            elif event.get("event") == "done":
                result.done = json.loads(event["data"])
                return result
            elif event.get("event") == "error":
                result.error = json.loads(event["data"])["error"]
                return result
            event = {}
    return result


def read_ws(base: str, job_id: str, query: str = "", timeout: float = 60) -> StreamResult:
    """Read a WebSocket stream to its last message; ``timeout`` bounds each read and the whole."""
    result = StreamResult()
    deadline = Deadline(timeout, f"WebSocket stream of {job_id}")
    ws = websocket.create_connection(
        base.replace("http://", "ws://") + f"/v1/jobs/{job_id}/ws{query}", timeout=timeout
    )
    try:
        while True:
            deadline.check(result)
            message = json.loads(ws.recv())
            if message["event"] == "token":
                # A frame is a run of tokens; the stream's indexes stay checkable run by run.
                result.tokens.append(
                    {"index": message["index"], "text": message["text"], "count": message["count"]}
                )
            elif message["event"] == "status":
                result.statuses.append({k: v for k, v in message.items() if k != "event"})
            elif message["event"] == "done":
                result.done = message["job"]
                return result
            else:
                result.done = message
                return result
    finally:
        ws.close()


def stream_in_background(
    base: str, job_id: str, timeout: float = 120
) -> tuple[threading.Thread, list[StreamResult]]:
    """Read a job's SSE stream to its end on a thread; the result lands in the list."""
    results: list[StreamResult] = []
    thread = threading.Thread(
        target=lambda: results.append(read_sse(base, job_id, timeout=timeout))
    )
    thread.start()
    return thread, results


def assert_gapless(stream: StreamResult) -> None:
    """The whole stream, every index once and in order, equal to the stored output."""
    assert stream.done is not None, stream.error
    assert stream.indexes == list(range(len(stream.tokens)))
    assert stream.text == stream.done["output"]
    assert len(stream.tokens) == stream.done["usage"]["completion_tokens"]


def batch_line(custom_id: str = "r1", **body: Any) -> dict[str, Any]:
    """One line of a batch input file: a one-token completion unless ``body`` says otherwise."""
    body = {"model": "demo", "prompt": "The", "max_tokens": 1, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def batch_read_in(
    base: str, batch_id: str, timeout: float = 60, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """The batch once the batch consumer has read its input into jobs (``POST /v1/batches``
    answers ``validating``)."""
    deadline = time.monotonic() + timeout
    while True:
        url = f"{base}/v1/batches/{batch_id}"
        batch: dict[str, Any] = requests.get(url, headers=headers, timeout=10).json()
        if batch["status"] != "validating":
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)
