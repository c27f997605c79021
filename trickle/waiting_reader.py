"""Reads what the waiting estimate needs from Redis: the workers' outlooks and the queued jobs.

Workers write their outlook (``publish_outlook``) from their maintenance loop, a few times a
second and never on the token path. A web process reads the queue and the outlooks at most once
per ``refresh_seconds`` for all its waiters together (``WaitEstimator``): a thousand waiting
readers cost the same Redis reads as one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from trickle import keys
from trickle.store import scripts
from trickle.store.redis_connection import is_cluster
from trickle.waiting import QueuedEntry, Waiting, WorkerOutlook, service_order, start_times

# Queued jobs read per refresh: a job further back is told its position alone.
MAX_QUEUED_READ = 2000
# What the estimate reads of each queued job, as ``scripts.QUEUED_FIELDS`` returns them.
WAITING_FIELDS = ("model", "priority", "tenant_digest", "max_tokens", "status")
# Jobs read per round trip, with a turn of the web's event loop between round trips: the
# reading of 2,000 jobs took 80 ms of one loop's CPU in one stretch, and every other request
# of the process (``/healthz`` too) waited behind it (``bench.batch_stall``).
READ_CHUNK = 200
# A job the snapshot does not know (submitted since) has it read again once it is this old:
# a burst's new readers cost a few reads a second, not one each.
MISS_REFRESH_SECONDS = 0.1


def publish_outlook(
    pipe: redis.client.Pipeline, node: str, outlooks: dict[str, WorkerOutlook], ttl: float
) -> None:
    """Queue the write of one worker's outlook per model; it lapses with its heartbeat."""
    name = keys.worker_outlook(node)
    pipe.hset(name, mapping={model: outlook.to_json() for model, outlook in outlooks.items()})
    pipe.pexpire(name, max(int(ttl * 1000), 1))


def read_outlooks(
    client: redis.Redis, models: set[str], fresh_since: float
) -> dict[str, list[WorkerOutlook]]:
    """The outlook of every live worker (heartbeat since ``fresh_since``) for each model."""
    found: dict[str, list[WorkerOutlook]] = {model: [] for model in models}
    for model in models:
        nodes = client.zrangebyscore(keys.model_workers(model), fresh_since, "+inf")
        if not nodes:
            continue
        pipe = client.pipeline(transaction=False)
        for node in nodes:
            pipe.hget(keys.worker_outlook(str(node)), model)
        found[model] = [WorkerOutlook.from_json(raw) for raw in pipe.execute() if raw]
    return found


def per_shard_read(limit: int) -> int:
    """How many of each shard's oldest jobs a read of the ``limit`` oldest takes at first:
    twice a shard's even share, at least 16 (2,000 jobs spread over 256 shards put more than
    16 on one or two of them; one request's jobs under an idempotency key share one shard).
    A shard read to its end is read again deeper (``read_queued``), where reading ``limit``
    of each took up to 256 times ``limit`` from a long queue."""
    return min(limit, max(16, 2 * -(-limit // keys.SHARDS)))


def _shard_heads(
    client: redis.Redis, names: Sequence[str], start: int, stop: int
) -> list[list[tuple[str, float]]]:
    """Each named shard's queued jobs from rank ``start`` to ``stop`` (inclusive), oldest
    first."""
    if is_cluster(client):  # one ZRANGE a shard: the shards live on many slots
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.zrange(name, start, stop, withscores=True)
        return [[(str(job_id), float(score)) for job_id, score in head] for head in pipe.execute()]
    found = client.register_script(scripts.QUEUED_HEADS)(keys=list(names), args=[start, stop])
    return [
        [(str(job_id), float(score)) for job_id, score in zip(flat[::2], flat[1::2], strict=True)]
        for flat in found
    ]


def oldest_queued(
    client: redis.Redis, limit: int, per_shard: int | None = None
) -> list[tuple[float, str]]:
    """The ``limit`` oldest queued jobs over every shard (score, job id), oldest first. Each
    shard is read ``per_shard`` deep; a shard read to its end may hide jobs older than another
    shard's last read, so only jobs up to the earliest such cut are exact, and while those
    are fewer than ``limit`` the shards read to their end are read again, twice as deep."""
    names = keys.every_shard(keys.queued_jobs)
    depth = min(per_shard or per_shard_read(limit), limit)
    heads = _shard_heads(client, names, 0, depth - 1)
    while True:
        full = [i for i, head in enumerate(heads) if len(head) == depth]
        cut = min((heads[i][-1][1] for i in full), default=float("inf"))
        kept = sorted((score, job_id) for head in heads for job_id, score in head if score <= cut)
        if not full or len(kept) >= limit or depth >= limit:
            return kept[:limit]
        depth = min(depth * 2, limit)  # read from the start again: claims move the ranks
        again = _shard_heads(client, [names[i] for i in full], 0, depth - 1)
        for i, head in zip(full, again, strict=True):
            heads[i] = head


def read_queued(
    client: redis.Redis, limit: int, per_shard: int | None = None
) -> dict[str, list[QueuedEntry]]:
    """The ``limit`` oldest queued jobs over every shard, by model (``oldest_queued``)."""
    scored = oldest_queued(client, limit, per_shard)
    by_model: dict[str, list[QueuedEntry]] = {}
    for start in range(0, len(scored), READ_CHUNK):
        if start:
            time.sleep(0)  # a turn of the event loop under gevent; elsewhere a GIL yield
        chunk = scored[start : start + READ_CHUNK]
        for (score, job_id), fields in zip(chunk, _job_fields(client, chunk), strict=True):
            model, priority, tenant_digest, max_tokens, status = fields
            if not model or status != "queued":  # gone, or claimed since the index was read
                continue
            entry = QueuedEntry(
                job_id, score, int(priority or 0), str(tenant_digest or ""), int(max_tokens)
            )
            by_model.setdefault(str(model), []).append(entry)
    return by_model


def _job_fields(client: redis.Redis, chunk: list[tuple[float, str]]) -> list[list[Any]]:
    """Each job's model, priority, tenant, ``max_tokens`` and status; ``max_tokens`` from its
    params where the job was recorded without the field of its own (before it existed)."""
    rows: list[list[Any]]
    if is_cluster(client):  # the jobs live on many slots: one HMGET each
        pipe = client.pipeline(transaction=False)
        for _score, job_id in chunk:
            pipe.hmget(keys.job(job_id), WAITING_FIELDS)
        rows = pipe.execute()
    else:
        flat = client.register_script(scripts.QUEUED_FIELDS)(
            keys=[keys.job(job_id) for _score, job_id in chunk]
        )
        width = len(WAITING_FIELDS)
        rows = [list(flat[at : at + width]) for at in range(0, len(flat), width)]
    older = [
        (row, job_id) for (_score, job_id), row in zip(chunk, rows, strict=True)
        if row[0] and row[3] is None
    ]  # fmt: skip
    if older:
        pipe = client.pipeline(transaction=False)
        for _row, job_id in older:
            pipe.hget(keys.job(job_id), "params")
        for (row, _job_id), params in zip(older, pipe.execute(), strict=True):
            row[3] = json.loads(params).get("max_tokens", 1) if params else 1
    return rows


def claimed_waiting(outlooks: list[WorkerOutlook], now: float) -> dict[str, Waiting]:
    """The jobs workers claimed that wait for a lane: ahead of every queued job, in the order
    they are expected to start."""
    found = sorted(
        (max(start - max(now - outlook.at, 0.0), 0.0), job_id)
        for outlook in outlooks
        for job_id, start in outlook.claimed_waiting
    )
    return {job_id: Waiting(position, start) for position, (start, job_id) in enumerate(found)}


@dataclass
class QueueSnapshot:
    """Every read queued job's estimate at one moment (monotonic ``taken``)."""

    taken: float
    waiting: dict[str, Waiting] = field(default_factory=dict)
    # Per model, the latest claim time the live workers' outlooks account for (wall clock): a
    # job claimed after it may wait for a lane, and no outlook read lists it yet.
    claims_through: dict[str, float] = field(default_factory=dict)


class WaitEstimator:
    """A web process's source of ``Waiting`` for queued jobs, shared by all its readers."""

    def __init__(
        self,
        client: redis.Redis,
        heartbeat_ttl: float,
        models: Iterable[str] = (),
        refresh_seconds: float = 0.5,
        clock: Callable[[], float] = time.time,
    ):
        """``models``: those whose workers' claimed jobs may wait for a lane (the configured
        ones); a model with queued jobs is read anyway."""
        self._client = client
        self._models = tuple(models)
        self._heartbeat_ttl = heartbeat_ttl
        self._refresh = refresh_seconds
        self._clock = clock
        self._snapshot = QueueSnapshot(taken=-float("inf"))
        # Built here, after gevent patched ``threading`` (see web.services' lock).
        self._lock = threading.Lock()

    def estimate(self, job_id: str, read_on_miss: bool = True) -> Waiting | None:
        """The job's position and expected start, None if it is not among the waiting jobs
        read (started meanwhile, or further back than ``MAX_QUEUED_READ``). The eta counts from
        now: a snapshot's estimates age with it. ``read_on_miss=False``: a job the snapshot
        does not know is not worth a read (a claimed job, most likely running already)."""
        snapshot = self._current()
        found = snapshot.waiting.get(job_id)
        stale = time.monotonic() - snapshot.taken >= MISS_REFRESH_SECONDS
        if found is None and read_on_miss and stale:
            snapshot = self._current(MISS_REFRESH_SECONDS)  # submitted since: read again
            found = snapshot.waiting.get(job_id)
        if found is None or found.eta_seconds is None:
            return found
        aged = max(found.eta_seconds - (time.monotonic() - snapshot.taken), 0.0)
        return Waiting(found.position, aged)

    def claim_seen(self, model: str, claimed_at: float) -> bool:
        """Whether the outlooks read account for a claim made at ``claimed_at``: a claimed job
        none of them lists as waiting for a lane is then in a batch. Until then (a busy worker
        publishes its outlook every half second) whether it waits is not known. No live
        worker's outlook: nothing to wait for. Its worker is not known, so the latest of the
        workers' accounts stands for it: one that lags behind another's claims can still be
        taken as seen (for half a second at most)."""
        through = self._current().claims_through.get(model)
        return through is None or through >= claimed_at

    def first_of(self, job_ids: Iterable[str]) -> Waiting | None:
        """The place and start of whichever of ``job_ids`` is expected to start first (a
        batch's next job), None if none of them is among the queued jobs read. A miss reads
        nothing more: most of a batch's next jobs run or ran, and a read on each miss made
        every GET of a running batch a read of the whole queue."""
        found = [
            waiting
            for job_id in job_ids
            if (waiting := self.estimate(job_id, read_on_miss=False))  # most run or ran
        ]
        return min(found, key=lambda waiting: waiting.position, default=None)

    def _current(self, refresh: float | None = None) -> QueueSnapshot:
        older_than = self._refresh if refresh is None else refresh
        if time.monotonic() - self._snapshot.taken < older_than:
            return self._snapshot
        with self._lock:  # one reader refreshes; the others wait for its result
            if time.monotonic() - self._snapshot.taken >= older_than:
                self._snapshot = self._read()
        return self._snapshot

    def _read(self) -> QueueSnapshot:
        now = self._clock()
        queued = read_queued(self._client, MAX_QUEUED_READ)
        models = set(queued) | set(self._models)
        outlooks = read_outlooks(self._client, models, now - self._heartbeat_ttl)
        snapshot = QueueSnapshot(time.monotonic())
        for model, entries in queued.items():
            order = service_order(entries)
            ahead = sum(len(outlook.claimed_waiting) for outlook in outlooks[model])
            for position, (entry, start) in enumerate(
                zip(order, start_times(order, outlooks[model], now), strict=True), ahead
            ):
                snapshot.waiting[entry.job_id] = Waiting(position, start)
        for model, found in outlooks.items():
            snapshot.waiting.update(claimed_waiting(found, now))
            if found:
                through = max(outlook.claims_seen_through for outlook in found)
                snapshot.claims_through[model] = through
        return snapshot
