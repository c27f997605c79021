"""RabbitMQ only: batch jobs are taken one at a time, into slots that interactive work left free.

Quorum queues on RabbitMQ 3.10 have no priorities, and RabbitMQ pushes messages to a consumer up
to its prefetch count: a worker consuming both a model's interactive and batch queue through
Celery would hold batch messages in its thread pool, first in, first out, ahead of interactive
jobs that arrive later. So Celery consumes only the interactive queues, and this feeder pulls
(``basic.get``) from the batch queues of the models the worker serves, one message per free
slot, where a slot is free when neither an interactive job nor a batch job of this feeder holds
it. An interactive job always finds its worker's Celery consumer ready for it, and is put first
in the engine's next batch; batch jobs fill what is left.

Acknowledgement is late, as for Celery's tasks: a batch message is acked once its job has ended
(stored, or handed back at shutdown). Should the worker die, RabbitMQ redelivers the message;
the Redis lease decides who runs the job, exactly as with Celery's own redeliveries.

The AMQP channel belongs to the feeder's thread alone: job threads hand their delivery tags
back through a queue, and a tag from a channel that has since been lost is dropped (RabbitMQ
already requeued its message).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from kombu import Connection, Queue

from worker import keys

log = logging.getLogger(__name__)

RECONNECT_SECONDS = 1.0


class BatchFeeder:
    def __init__(
        self,
        connect: Callable[[], Connection],
        queues: Mapping[str, Queue],
        room: Callable[[str], int],
        run_job: Callable[[str], None],
        poll_seconds: float,
    ):
        """``queues``: model -> its batch queue; ``room(model)``: slots of that model that no
        interactive job holds; ``run_job(job_id)`` returns once the job has ended."""
        self._connect = connect
        self._queues = dict(queues)
        self._room = room
        self._run_job = run_job
        self._poll_seconds = poll_seconds
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._finished: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._active: Counter[str] = Counter()
        self._idle = threading.Condition(self._lock)
        self._channel_generation = 0
        probe = connect()  # kombu connects lazily: this only learns the transport's errors
        self._errors = (OSError, *probe.connection_errors, *probe.channel_errors)
        probe.release()
        self._thread = threading.Thread(target=self._run, name="trickle-batch-feeder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop_taking(self) -> None:
        """Warm shutdown: take no more batch work (what runs ends and is acked as usual)."""
        self._stopping.set()
        self._wake.set()

    def join(self, timeout: float) -> None:
        """Wait for the batch jobs this feeder started, then for its thread (which acks them)."""
        self.stop_taking()
        with self._idle:
            self._idle.wait_for(lambda: not any(self._active.values()), timeout)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def active(self, model: str) -> int:
        with self._lock:
            return self._active[model]

    def _done(self) -> bool:
        """Stopped, and every batch job it started has ended."""
        with self._lock:
            return self._stopping.is_set() and not any(self._active.values())

    def _run(self) -> None:
        while not self._done():
            try:
                with self._connect() as conn:
                    self._serve(conn)
            except self._errors as exc:
                # Unacked messages are back in their queue already; running jobs go on.
                log.warning("batch feeder: broker connection lost (%s); reconnecting", exc)
                self._wake.wait(RECONNECT_SECONDS)
                self._wake.clear()

    def _serve(self, conn: Connection) -> None:
        channel = conn.channel()
        self._channel_generation += 1
        generation = self._channel_generation
        bound = {model: q.bind(channel) for model, q in self._queues.items()}
        for declared in bound.values():
            declared.declare()
        while not self._done():
            self._ack_finished(channel, generation)
            took = not self._stopping.is_set() and self._take(bound, generation)
            conn.heartbeat_check()
            if not took:
                self._idle_wait(conn)
        self._ack_finished(channel, generation)

    def _idle_wait(self, conn: Connection) -> None:
        """Wait one poll interval reading the socket, so the broker's heartbeats are seen (a
        plain sleep would leave them unread and look like a dead broker)."""
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=self._poll_seconds)

    def _take(self, bound: Mapping[str, Queue], generation: int) -> bool:
        """At most one message per model with room; True if any was taken."""
        took = False
        for model, batch_queue in bound.items():
            if self._room(model) - self.active(model) <= 0:
                continue
            message = batch_queue.get(no_ack=False, accept=["json"])
            if message is None:
                continue
            try:
                job_id = job_id_of(message.headers, message.decode())
            except Exception:  # not JSON, or not ours: nothing could ever run it
                job_id = None
            if job_id is None:
                log.error("batch feeder: dropped a message that names no job: %r", message.body)
                message.ack()
                continue
            with self._lock:
                self._active[model] += 1
            threading.Thread(
                target=self._run_one,
                args=(model, job_id, generation, message.delivery_tag),
                name=f"trickle-batch-{job_id}",
                daemon=True,
            ).start()
            took = True
        return took

    def _run_one(self, model: str, job_id: str, generation: int, tag: int) -> None:
        try:
            self._run_job(job_id)
        except Exception:  # the edge of a job thread, as Celery's task wrapper would be
            log.exception("batch job %s failed in its worker", job_id)
        finally:
            self._finished.put((generation, tag))
            with self._idle:
                self._active[model] -= 1
                self._idle.notify_all()

    def _ack_finished(self, channel: Any, generation: int) -> None:
        while True:
            try:
                finished_generation, tag = self._finished.get_nowait()
            except queue.Empty:
                return
            if finished_generation == generation:
                channel.basic_ack(tag)


def job_id_of(headers: Mapping[str, Any], payload: Any) -> str | None:
    """The job id a Celery ``trickle.generate`` message carries, or None for anything else."""
    if headers.get("task") != keys.GENERATE_TASK:
        return None
    try:
        return str(payload[0][0])
    except (IndexError, KeyError, TypeError):
        return None
