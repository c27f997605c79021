"""The clients of ``bench.chaos``: they behave as careful real ones do while things die.

Every POST carries an ``Idempotency-Key`` and is retried with it until answered (through
refused connections, cut connections and 503s), and every id any answer named is kept, so a
key that made two jobs shows. A streamed job is followed over SSE and resumed with
``Last-Event-ID`` after any error, as a browser's ``EventSource`` does; a polled job is read
with ``GET`` until it is final.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import requests

FINAL = ("succeeded", "failed", "canceled")
RETRY_SECONDS = 0.2
# Long enough for any restart the run makes, short enough that a hang fails the run.
GIVE_UP_SECONDS = 240.0
MISSING_SECONDS = 10.0


class Ledger:
    """Every key and the ids its answers named, shared by all client threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ids_by_key: dict[str, set[str]] = {}
        self.refused: list[str] = []  # answers that were neither a job nor worth a retry

    def note(self, key: str, job_id: str) -> None:
        with self._lock:
            self.ids_by_key.setdefault(key, set()).add(job_id)

    def refuse(self, what: str) -> None:
        with self._lock:
            self.refused.append(what)


def post_job(base: str, body: dict[str, Any], key: str, ledger: Ledger) -> str | None:
    """POST until answered with a job (its id), or until a 4xx that no retry fixes."""
    deadline = time.monotonic() + GIVE_UP_SECONDS
    while time.monotonic() < deadline:
        try:
            response = requests.post(
                f"{base}/v1/jobs", json=body, headers={"Idempotency-Key": key}, timeout=30
            )
        except requests.RequestException:
            time.sleep(RETRY_SECONDS)
            continue
        if response.status_code in (200, 202):
            job_id = str(response.json()["id"])
            ledger.note(key, job_id)
            return job_id
        if response.status_code not in (429, 500, 502, 503):
            ledger.refuse(f"{key}: {response.status_code} {response.text[:200]}")
            return None
        time.sleep(RETRY_SECONDS)
    ledger.refuse(f"{key}: never answered")
    return None


@dataclass
class Stream:
    """What one SSE reader received for one job, across all its connections."""

    job_id: str
    indexes: list[int] = field(default_factory=list)
    text: str = ""
    done: dict[str, Any] | None = None
    resumes: int = 0


def read_events(base: str, stream: Stream, timeout: float = 30) -> None:
    """One connection: from after the last index received (all of it if none) until ``done``,
    an ``error`` event, a non-200 answer or a cut."""
    headers = {"Last-Event-ID": str(stream.indexes[-1])} if stream.indexes else {}
    url = f"{base}/v1/jobs/{stream.job_id}/events"
    with requests.get(url, headers=headers, stream=True, timeout=timeout) as response:
        if response.status_code != 200:
            return
        event: dict[str, str] = {}
        for line in response.iter_lines():
            raw = line.decode()
            if raw and not raw.startswith(":"):
                name, _, value = raw.partition(": ")
                event[name] = value
                continue
            if event.get("event") == "token":
                token = json.loads(event["data"])
                stream.indexes.append(int(token["index"]))
                stream.text += token["text"]
            elif event.get("event") == "done":
                stream.done = json.loads(event["data"])
                return
            elif event.get("event") == "error":
                return
            event = {}


def follow(base: str, stream: Stream) -> None:
    """Read until ``done``, resuming after every error as an ``EventSource`` would."""
    deadline = time.monotonic() + GIVE_UP_SECONDS
    while stream.done is None and time.monotonic() < deadline:
        # A cut mid-stream: resume from the last index received.
        with contextlib.suppress(requests.RequestException, ValueError):
            read_events(base, stream)
        if stream.done is None:
            stream.resumes += 1
            time.sleep(RETRY_SECONDS)


def replay(base: str, job_id: str) -> Stream:
    """A fresh reader from the first token, after the job ended (one try per outage)."""
    fresh = Stream(job_id)
    follow(base, fresh)
    return fresh


def poll(base: str, job_id: str) -> dict[str, Any] | None:
    """GET the job until it is final; None if it never is, or if it answers 404 for
    ``MISSING_SECONDS`` on end (its record vanished: a lost job)."""
    deadline = time.monotonic() + GIVE_UP_SECONDS
    missing_since: float | None = None
    while time.monotonic() < deadline:
        try:
            response = requests.get(f"{base}/v1/jobs/{job_id}", timeout=30)
            if response.status_code == 200 and response.json()["status"] in FINAL:
                return dict(response.json())
            if response.status_code != 404:
                missing_since = None
            elif missing_since is None:
                missing_since = time.monotonic()
            elif time.monotonic() - missing_since > MISSING_SECONDS:
                return None
        except (requests.RequestException, ValueError):
            pass
        time.sleep(RETRY_SECONDS * 2)
    return None


class Traffic:
    """Open-loop arrivals: each job is its own thread, started on schedule whatever the
    others do, so a stalled service meets a growing queue, as it would in production."""

    def __init__(self, base: str, body: dict[str, Any]):
        self.base, self.body = base, body
        self.ledger = Ledger()
        self.streams: list[Stream] = []
        self.polled: list[str] = []
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _streamed(self) -> None:
        job_id = post_job(self.base, self.body, f"chaos-s-{uuid.uuid4()}", self.ledger)
        if job_id is not None:
            stream = Stream(job_id)
            with self._lock:
                self.streams.append(stream)
            follow(self.base, stream)

    def _polled(self) -> None:
        job_id = post_job(self.base, self.body, f"chaos-p-{uuid.uuid4()}", self.ledger)
        if job_id is not None:
            with self._lock:
                self.polled.append(job_id)
            poll(self.base, job_id)

    def run(self, seconds: float, streams_per_s: float, polled_per_s: float) -> None:
        """Start arrivals at fixed rates for ``seconds``; returns when the last has started."""
        start = time.monotonic()
        arrivals = sorted(
            [(i / streams_per_s, self._streamed) for i in range(int(seconds * streams_per_s))]
            + [(i / polled_per_s, self._polled) for i in range(int(seconds * polled_per_s))],
            key=lambda arrival: arrival[0],
        )
        for at, target in arrivals:
            time.sleep(max(0.0, start + at - time.monotonic()))
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(GIVE_UP_SECONDS + 60)
