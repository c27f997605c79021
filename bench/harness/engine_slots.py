"""How a person would serve arrivals with CTranslate2 alone, which cannot add a row to a
running batch (its issue 1333): a few slots, each running one call at a time.

A free slot takes the jobs waiting, oldest first, up to its policy's batch size, as one call:
with a batch of one it is "one call per arrival on K concurrent calls", with no limit it is
static batching (everything that queued while the slot was busy goes in the next call). The
call itself is passed in, so the queue logic is tested with a fake one and the benchmark runs
it on a ``ctranslate2.Generator``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ArrivedJob:
    """One arrival: when it came, when its call started and when each of its tokens came out."""

    index: int
    arrived: float = 0.0
    started: float | None = None
    token_times: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class SlotPolicy:
    """``slots`` calls at once, each of at most ``max_batch`` jobs (0: everything waiting)."""

    name: str
    slots: int
    max_batch: int

    def describe(self) -> str:
        if self.max_batch == 1:
            return f"one call per arrival, {self.slots} at once"
        limit = f"up to {self.max_batch}" if self.max_batch else "everything waiting"
        return f"static batching on {self.slots} replica(s), {limit} per call"


def parse_policy(text: str) -> SlotPolicy:
    """``static<R>`` (a free replica takes everything waiting) or ``call<K>`` (one job per call,
    K calls at once), as ``--policies`` names them."""
    for prefix, max_batch in (("static", 0), ("call", 1)):
        if text.startswith(prefix) and text[len(prefix) :].isdigit():
            slots = int(text[len(prefix) :])
            if slots >= 1:
                return SlotPolicy(text, slots, max_batch)
    raise ValueError(f"policy {text!r}: expected static<R> or call<K> with R, K >= 1")


Call = Callable[[list[ArrivedJob]], None]
"""Runs one engine call for its jobs, appending to each job's ``token_times`` as tokens come."""


class SlotPool:
    """``policy.slots`` threads serving a shared queue; ``calls`` records each call's size."""

    def __init__(
        self, policy: SlotPolicy, call: Call, clock: Callable[[], float] = time.perf_counter
    ):
        self.policy = policy
        self.calls: list[int] = []
        self._call = call
        self._clock = clock
        self._waiting: deque[ArrivedJob] = deque()
        self._ready = threading.Condition()
        self._closing = False
        self._failure: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._serve, name=f"slot-{n}", daemon=True)
            for n in range(policy.slots)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: ArrivedJob) -> None:
        """Queue ``job``, stamped as arrived now; a free slot starts it at once."""
        job.arrived = self._clock()
        with self._ready:
            if self._closing:
                raise RuntimeError("the pool is closed")
            self._waiting.append(job)
            self._ready.notify()

    def close(self) -> None:
        """Serve everything queued, then stop the slots; a call's error is raised here."""
        with self._ready:
            self._closing = True
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()
        if self._failure is not None:
            raise RuntimeError("an engine call failed") from self._failure

    def _take(self) -> list[ArrivedJob] | None:
        """The next call's jobs, or None once closed with nothing left."""
        with self._ready:
            while not self._waiting and not self._closing:
                self._ready.wait()
            if not self._waiting:
                return None
            size = self.policy.max_batch or len(self._waiting)
            batch = [self._waiting.popleft() for _ in range(min(size, len(self._waiting)))]
            self.calls.append(len(batch))
            return batch

    def _serve(self) -> None:
        while (batch := self._take()) is not None:
            began = self._clock()
            for job in batch:
                job.started = began
            try:
                self._call(batch)
            except BaseException as exc:  # handed to close(), which raises it
                self._failure = exc
