"""The worker's own consumer of generation tasks on a plain Redis broker.

Celery's consumer takes one message per event-loop turn: a ``BRPOP``, a synchronous write of
kombu's unacked record, then the hand-off to a task thread. Measured on an idle worker, 16
one-token jobs pushed at once reached their task threads 4-9 ms apart (60-150 ms for the last
one); under a burst that was the largest hop between a POST and its first token. This feeder
takes every waiting message it has room for in one script, claims those jobs in one more round
trip (``claim_many``), runs each in its own thread, and leaves Celery only the webhook queue.

Reliability is kombu's, made explicit: the script moves each message from its queue to this
worker's *taken* list in the same atomic step (``keys.worker_taken``), and a job's entry is
removed only once ``run_job`` returns (its result stored, or the job handed back). Should the
worker die, any live worker's sweep puts the dead worker's taken messages back at the head of
their queues (``return_dead_feeders``); a worker restarted under the same node name puts back its
previous life's at start. Jobs already claimed are also covered by their leases, as before.

Waiting: a thread per queue list blocks on ``BLMOVE list list RIGHT RIGHT`` (the tail goes back
to the tail: nothing moves), which returns as soon as a message is there, and wakes the feeder.
Used where the web tier pushes messages itself (``queueing.direct_feed``): RabbitMQ and task
events keep Celery's consumer.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis

from worker import keys
from worker.capacity import message_job_id

log = logging.getLogger(__name__)

IDLE_POLL_SECONDS = 0.5  # the feeder looks again this often without a wake-up
BLOCK_SECONDS = 1  # each waker's BLMOVE timeout (below the client's socket timeout)

# KEYS[1]: this worker's taken list; KEYS[2..]: queue lists, most urgent first.
# ARGV[1]: the most messages to take. Returns the taken entries ("<list>\n<message>").
TAKE = """
local want = tonumber(ARGV[1])
local taken = {}
for i = 2, #KEYS do
  while #taken < want do
    local message = redis.call('RPOP', KEYS[i])
    if not message then break end
    local entry = KEYS[i] .. '\\n' .. message
    redis.call('RPUSH', KEYS[1], entry)
    taken[#taken + 1] = entry
  end
end
return taken
"""

# KEYS[1]: a taken list. Puts every entry back at the tail of its queue (the next to be taken),
# oldest last so it goes first; deletes the list. Returns how many went back.
GIVE_BACK = """
local entries = redis.call('LRANGE', KEYS[1], 0, -1)
for i = #entries, 1, -1 do
  local cut = string.find(entries[i], '\\n', 1, true)
  redis.call('RPUSH', string.sub(entries[i], 1, cut - 1), string.sub(entries[i], cut + 1))
end
redis.call('DEL', KEYS[1])
return #entries
"""


class JobFeeder:
    """Takes generation tasks off ``queues`` into ``slots`` job threads running ``run_job``;
    every ``sweep_seconds`` puts back the taken messages of feeders whose node is not ``live``."""

    def __init__(
        self,
        client: redis.Redis,
        node: str,
        queues: Sequence[str],
        slots: int,
        run_job: Callable[[str, Any], None],
        connect_blocking: Callable[[], redis.Redis],
        live: Callable[[str], bool],
        sweep_seconds: float,
        claim_many: Callable[[list[str]], Sequence[Any]] | None = None,
    ):
        self._client = client
        self._node = node
        self._taken_key = keys.worker_taken(node)
        self._queues = list(queues)
        self._slots = slots
        self._run_job = run_job
        self._connect_blocking = connect_blocking
        self._take = client.register_script(TAKE)
        self._give_back = client.register_script(GIVE_BACK)
        self._live = live
        # Claims for a whole take in one round trip, handed to run_job(job_id, claim); without
        # it (or should it fail) each job thread claims its own job.
        self._claim_many = claim_many
        self._sweep_seconds = sweep_seconds
        self._next_sweep = 0.0
        self._lock = threading.Condition()
        self._busy = 0
        self._wake = threading.Event()
        self._has_room = threading.Event()
        self._has_room.set()
        self._stopping = threading.Event()
        self._jobs = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="trickle-job")
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start feeding (in the background: Redis may be down right now)."""
        self._spawn(self._feed, "trickle-feeder")
        for queue in self._queues:
            self._spawn(functools.partial(self._watch, queue), "trickle-feeder-wake")

    def _register(self) -> None:
        """Before the first take: be known to the sweep, and put back what a previous process
        with this node name took and never finished. Retried until Redis answers."""
        while not self._stopping.is_set():
            try:
                self._client.sadd(keys.FEEDERS, self._node)
                returned = int(self._give_back(keys=[self._taken_key]))
            except redis.RedisError:
                log.exception("job feeder cannot reach Redis; retrying")
                self._stopping.wait(BLOCK_SECONDS)
                continue
            if returned:
                log.warning("put back %d task message(s) of this node's previous life", returned)
            return

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop_taking(self) -> None:
        """Take nothing more (warm shutdown); jobs already taken run to their end."""
        self._stopping.set()
        self._wake.set()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for every taken job to end (stored or handed back)."""
        with self._lock:
            ended = self._lock.wait_for(lambda: self._busy == 0, timeout)
        self._jobs.shutdown(wait=ended)
        return ended

    def _room(self) -> int:
        with self._lock:
            return self._slots - self._busy

    def _feed(self) -> None:
        self._register()
        while not self._stopping.is_set():
            self._sweep()
            self._wake.clear()
            room = self._room()
            entries: list[str] = []
            if room > 0:
                try:
                    entries = [
                        str(e)
                        for e in self._take(keys=[self._taken_key, *self._queues], args=[room])
                    ]
                except redis.RedisError:
                    log.exception("taking jobs failed; retrying")
            jobs = [job for job in map(self._job_of, entries) if job is not None]
            claims = self._claims([job_id for job_id, _entry in jobs])
            for (job_id, entry), claim in zip(jobs, claims, strict=True):
                self._start_job(job_id, entry, claim)
            if not entries:
                self._wake.wait(IDLE_POLL_SECONDS)

    def _job_of(self, entry: str) -> tuple[str, str] | None:
        """(job id, entry); None for a message that names no job (dropped, and logged)."""
        _queue, _, message = entry.partition("\n")
        job_id = message_job_id(message)
        if job_id is None:
            log.error("dropped a task message that names no job: %.200s", message)
            self._done(entry)
            return None
        return job_id, entry

    def _claims(self, job_ids: list[str]) -> Sequence[Any]:
        if not job_ids or self._claim_many is None:
            return [None] * len(job_ids)
        try:
            return self._claim_many(job_ids)
        except redis.RedisError:
            log.exception("claiming %d jobs at once failed; each claims its own", len(job_ids))
            return [None] * len(job_ids)

    def _start_job(self, job_id: str, entry: str, claim: Any) -> None:
        with self._lock:
            self._busy += 1
            if self._busy >= self._slots:
                self._has_room.clear()
        self._jobs.submit(self._run, job_id, entry, claim)

    def _run(self, job_id: str, entry: str, claim: Any) -> None:
        try:
            self._run_job(job_id, claim)  # None: the job thread claims its own job
        except Exception:  # the edge of a job thread: log it; the lease sweep takes the job over
            log.exception("job %s: run_job failed", job_id)
        finally:
            self._done(entry)
            with self._lock:
                self._busy -= 1
                self._has_room.set()
                self._lock.notify_all()
            self._wake.set()

    def _sweep(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._sweep_seconds
        try:
            for node, count in return_dead_feeders(self._client, self._live).items():
                log.warning("put back %d task message(s) taken by lost worker %s", count, node)
        except redis.RedisError:
            log.exception("sweeping lost workers' taken messages failed; retrying")

    def _done(self, entry: str) -> None:
        try:
            self._client.lrem(self._taken_key, 1, entry)
        except redis.RedisError:  # left in the list: a restart under this name gives it back,
            log.exception("could not clear a finished job's taken entry")  # and a claim refuses it

    def _watch(self, queue: str) -> None:
        """Wake the feeder whenever ``queue`` holds a message (see the module docstring)."""
        client: Any = None
        while not self._stopping.is_set():
            try:
                if client is None:
                    client = self._connect_blocking()
                if client.blmove(queue, queue, BLOCK_SECONDS, "RIGHT", "RIGHT") is not None:
                    self._wake.set()
                    # Block again once the feeder could take it: while every slot is busy the
                    # message stays queued and BLMOVE would return at once, in a loop.
                    self._has_room.wait(BLOCK_SECONDS)
                    self._stopping.wait(0.0005)
            except redis.RedisError:
                client = None
                self._stopping.wait(BLOCK_SECONDS)


def return_dead_feeders(client: redis.Redis, live: Callable[[str], bool]) -> dict[str, int]:
    """Put back the taken messages of every feeder whose worker is no longer ``live``; returns
    {node: messages put back}. Any number of workers may run it at once (one script each)."""
    give_back = client.register_script(GIVE_BACK)
    returned: dict[str, int] = {}
    for node in client.smembers(keys.FEEDERS):
        node = str(node)
        if live(node):
            continue
        count = int(give_back(keys=[keys.worker_taken(node)]))
        client.srem(keys.FEEDERS, node)
        if count:
            returned[node] = count
    return returned
