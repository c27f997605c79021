"""The Messages API as the in-process tests drive it: every refusal checked against Anthropic's
error shape, a stream read on a thread (and dropped when a test says), and the job behind it
driven the way workers drive one (claim, fenced token appends, finish)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from trickle.events import TokenEvent
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, JobStatus
from trickle.store.job_store import JobStore, StepAppend
from web.services import services


def refused(reply: Any, status: int, kind: str, *named: str) -> str:
    """The Anthropic error body of ``reply``, checked; its message names every one of ``named``."""
    body = reply.get_json()
    assert reply.status_code == status, body
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind, body
    message: str = body["error"]["message"]
    for name in named:
        assert name in message, message
    return message


def store_of(app: Flask) -> JobStore:
    return services(app).store


def append(store: JobStore, job_id: str, fence: str, first: int, count: int) -> None:
    tokens = [TokenEvent(job_id, i, f"<{i}>", -0.5) for i in range(first, first + count)]
    pipe = store.redis.pipeline(transaction=False)
    store.queue_step(pipe, [StepAppend(job_id, fence, tokens, time.time())])
    (reply,) = pipe.execute()
    assert not store.step_outcome([StepAppend(job_id, fence, tokens)], reply).fenced_out


def finish(
    store: JobStore, job_id: str, fence: str, count: int, reason: FinishReason, stop: str = ""
) -> None:
    output = "".join(f"<{i}>" for i in range(count))
    result = JobResult(JobStatus.SUCCEEDED, output, reason, count, time.time(), stop_sequence=stop)
    assert store.finish(job_id, fence, result)


def events_of(text: str) -> list[tuple[str | None, str, dict[str, Any]]]:
    """(id, event, data) of every SSE event in ``text``."""
    found = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            found.append((fields.get("id"), fields["event"], json.loads(fields["data"])))
    return found


class Reader:
    """A stream read on a thread; ``stop_after`` events, then the client drops it."""

    def __init__(
        self,
        client: FlaskClient,
        body: dict[str, Any],
        headers: dict[str, str],
        stop_after: int | None = None,
    ):
        self.text = ""
        self.events: list[tuple[str | None, str, dict[str, Any]]] = []
        self._thread = threading.Thread(target=self._read, args=(client, body, headers, stop_after))
        self._thread.start()

    def _read(
        self,
        client: FlaskClient,
        body: dict[str, Any],
        headers: dict[str, str],
        stop_after: int | None,
    ) -> None:
        reply = client.post("/v1/messages", json=body, headers=headers, buffered=False)
        assert reply.status_code == 200, reply.get_data(as_text=True)
        for chunk in reply.response:  # type: ignore[union-attr]
            self.text += chunk.decode()
            self.events = events_of(self.text)
            if stop_after is not None and len(self.events) >= stop_after:
                break
        reply.close()

    def join(self) -> list[tuple[str | None, str, dict[str, Any]]]:
        self._thread.join(30)
        assert not self._thread.is_alive()
        return self.events


def job_of(events: list[tuple[str | None, str, dict[str, Any]]]) -> str:
    return "job_" + events[0][2]["message"]["id"].removeprefix("msg_")


def text_of(events: list[tuple[str | None, str, dict[str, Any]]]) -> str:
    return "".join(e[2]["delta"]["text"] for e in events if e[1] == "content_block_delta")
