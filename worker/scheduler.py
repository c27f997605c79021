"""Dynamic batching: jobs waiting when the engine is free run together in one generate_batch.

Each engine thread takes the oldest waiting job, waits up to ``max_batch_wait_ms`` for company,
and runs every waiting job that shares its sampling configuration (up to ``max_batch_size``) as
one batch. Per-job limits (max tokens, stop strings, cancellation) are enforced in the callback,
which stops only its own sequence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from worker.engine import Engine, EngineRequest
from worker.events import TokenEvent
from worker.jobs import FinishReason
from worker.sequence import SequenceState

log = logging.getLogger(__name__)


@dataclass
class ScheduledJob:
    job_id: str
    request: EngineRequest
    state: SequenceState
    ended: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


TokenSink = Callable[[TokenEvent, float | None], None]


class BatchScheduler:
    def __init__(
        self,
        engine: Engine,
        publish_token: TokenSink,
        max_batch_size: int,
        max_batch_wait_ms: float,
        engine_threads: int = 1,
    ):
        self._engine = engine
        self._publish_token = publish_token
        self._max_batch_size = max_batch_size
        self._max_batch_wait = max_batch_wait_ms / 1000.0
        self._pending: list[ScheduledJob] = []
        self._cond = threading.Condition()
        self._closed = False
        self.batch_sizes: list[int] = []
        self._threads = [
            threading.Thread(target=self._run, name=f"trickle-engine-{i}", daemon=True)
            for i in range(engine_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: ScheduledJob) -> None:
        with self._cond:
            self._pending.append(job)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run_batch(batch)

    def _next_batch(self) -> list[ScheduledJob] | None:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            deadline = time.monotonic() + self._max_batch_wait
            while len(self._pending) < self._max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            first = self._pending[0].request
            if first.seed is not None:
                batch = [self._pending[0]]  # seeded jobs sample step by step, alone
            else:
                batch = [
                    job
                    for job in self._pending
                    if job.request.sampling == first.sampling and job.request.seed is None
                ][: self._max_batch_size]
            chosen = {id(job) for job in batch}
            self._pending = [job for job in self._pending if id(job) not in chosen]
            return batch

    def _run_batch(self, batch: list[ScheduledJob]) -> None:
        self.batch_sizes.append(len(batch))

        def on_step(position: int, token_id: int, logprob: float | None, is_last: bool) -> bool:
            job = batch[position]
            outcome = job.state.on_token(token_id, is_last)
            if outcome.index is not None:
                first = time.time() if outcome.index == 0 else None
                event = TokenEvent(job.job_id, outcome.index, outcome.text, logprob)
                self._publish_token(event, first)
            return outcome.finish_reason is not None

        try:
            self._engine.generate([job.request for job in batch], on_step)
        except Exception as exc:  # the engine failed: every job of this batch fails with it
            log.exception("generate_batch failed for %d job(s)", len(batch))
            for job in batch:
                job.error = exc
                job.state.finish_without_token(FinishReason.ERROR)
        for job in batch:
            # Ended without a final callback (a cancel seen after the last step, a short batch).
            job.state.finish_without_token(
                FinishReason.CANCELED
                if job.state.cancel_requested.is_set()
                else FinishReason.LENGTH
            )
            job.ended.set()
