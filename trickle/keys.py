"""Every Redis key, channel and Celery queue name Trickle uses, and nothing else.

One module owns the schema so the web tier and the workers can never drift apart; the exact strings
are pinned by tests/unit/test_keys.py.
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from collections.abc import Callable

PREFIX = "trickle"

# Every job lives in one of SHARDS shards, chosen by hashing its id. A shard's keys share a Redis
# Cluster hash tag ("{s<n>}"), so everything a job's Lua scripts touch (its hash, replay log,
# lease, partial output, the shard's queued/running indexes, its channels) sits in one slot, and
# the scripts stay single-slot on a cluster. On a single Redis the tag is just part of the name.
# Part of the schema: changing it re-homes every job, so it is a constant, not a setting.
SHARDS = 256

GENERATE_TASK = "trickle.generate"
WEBHOOK_TASK = "trickle.webhook"
# Every worker consumes this queue, whatever models it serves.
WEBHOOK_QUEUE = f"{PREFIX}.webhooks"
# Batch work (reading an input file into jobs, settling a batch into its files, the periodic
# sweep) runs on this queue, consumed by the Procfile's ``batch`` process (web/batch_consumer.py)
# and by no generation worker.
BATCH_QUEUE = f"{PREFIX}.batches"
BATCH_INGEST_TASK = "trickle.batch_ingest"
BATCH_SETTLE_TASK = "trickle.batch_settle"
BATCH_SWEEP_TASK = "trickle.batch_sweep"


def shard_of_uncached(job_id: str) -> int:
    """The job's shard: stable across processes and releases (CRC-32, not Python's hash)."""
    return zlib.crc32(job_id.encode()) % SHARDS


shard_of = functools.lru_cache(maxsize=65_536)(shard_of_uncached)


def _tag(shard: int) -> str:
    return f"{PREFIX}:{{s{shard}}}"


@functools.lru_cache(maxsize=65_536)  # built for every job at every decoding step
def job(job_id: str) -> str:
    """Hash holding the job's parameters, status, timings and final result."""
    return f"{_tag(shard_of(job_id))}:job:{job_id}"


def job_tokens(job_id: str) -> str:
    """List of the job's token events (the replay log); list position == token index."""
    return f"{job(job_id)}:tokens"


def job_output(job_id: str) -> str:
    """String of the text streamed so far while the job runs (APPENDed with each step), so a
    GET of a running job reads its output instead of parsing the replay log; deleted once the
    final output is in the job hash."""
    return f"{job(job_id)}:output"


def job_lease(job_id: str) -> str:
    """String naming the worker attempt that may run the job ("<node>:<attempt>"); expires
    unless renewed, which is how a dead worker's jobs are noticed."""
    return f"{job(job_id)}:lease"


def job_republished(job_id: str) -> str:
    """String (with a TTL) set by the worker that published a job's lost task again, so the
    other workers' sweeps do not publish it too."""
    return f"{job(job_id)}:republished"


def job_readers(job_id: str) -> str:
    """Hash: how many streamed requests with an Idempotency-Key read the job now ("attached")
    and when the last one's client left ("left_at"), which starts the grace a retry has to
    re-attach before the job is canceled (web/streams/hold.py)."""
    return f"{job(job_id)}:readers"


# Token plane: two channels per job, published to from inside the job's Lua scripts. A web
# process subscribes to a job's channel only while one of its own readers follows the job, so
# it never receives (let alone decodes) tokens nobody there reads, and a channel without
# subscribers costs Redis only the PUBLISH.


@functools.lru_cache(maxsize=65_536)
def job_events_channel(job_id: str) -> str:
    """The job's token messages and its done message (stream readers)."""
    return f"{_tag(shard_of(job_id))}:events:{job_id}"


def job_done_channel(job_id: str) -> str:
    """Only the job's done message (``Prefer: wait`` waiters need the finish, not the tokens)."""
    return f"{_tag(shard_of(job_id))}:done:{job_id}"


def job_of_channel(channel: str) -> str:
    """The job id a job channel names (the part after the last colon)."""
    return channel.rsplit(":", 1)[-1]


# Sorted sets of job ids, one pair per shard: running ones (scored by claim time) and queued
# ones (scored by the moment they expire unless started). Workers sweep them to recover and
# expire jobs.


def running_jobs(shard: int) -> str:
    return f"{_tag(shard)}:running"


def queued_jobs(shard: int) -> str:
    return f"{_tag(shard)}:queued"


def deadline_jobs(shard: int) -> str:
    """Sorted set of the shard's jobs that have a client's deadline: job id -> the deadline.
    Workers sweep it, so a job no worker claims in time still ends ``expired`` then."""
    return f"{_tag(shard)}:deadlines"


def deadlines_next() -> str:
    """Sorted set, one key for every shard: job id -> its deadline, for the jobs whose deadline
    has not been swept yet. A worker reads its first entry each maintenance tick (one command,
    where the shards' indexes take one each) to sweep them at the earliest deadline."""
    return f"{PREFIX}:deadlines-next"


@functools.cache
def every_shard(index: Callable[[int], str]) -> tuple[str, ...]:
    """A per-shard key's name for every shard, in shard order, built once per key: a count over
    the shards (a queue position, the queued and running totals) names all of them."""
    return tuple(index(shard) for shard in range(SHARDS))


# Metrics workers record and /metrics exposes: one hash of counters ("<name>|<labels>" ->
# value) and one hash per histogram ("<labels>|<upper bound>" -> count, plus "|sum", "|count").
METRIC_COUNTERS = f"{PREFIX}:metrics:counters"


def metric_histogram(name: str) -> str:
    return f"{PREFIX}:metrics:hist:{name}"


# Keys written together (one transaction or script) share a hash tag, as a job's keys do.


def response(response_id: str) -> str:
    """String holding a stored Responses API response (its job, conversation and echoed
    request fields, JSON); the text and state are its job's."""
    return f"{PREFIX}:response:{{{response_id}}}"


def batch(batch_id: str) -> str:
    """Hash of a batch: status, tenant, timestamps, request count."""
    return f"{PREFIX}:batch:{{{batch_id}}}"


def batch_items(batch_id: str) -> str:
    """List of a batch's requests in input order: custom_id, url, body, job ids or error."""
    return f"{batch(batch_id)}:items"


def batch_room_stalled(batch_id: str) -> str:
    """String (with a TTL) a file batch's reading sets while it waits for output room with
    none of its own lines running: only other batches of its key could give room back, so two
    such batches would wait on each other (web/batches/ingest.py breaks the tie)."""
    return f"{batch(batch_id)}:room-stalled"


def batch_ingest(batch_id: str) -> str:
    """String (with a TTL) held by the batch task reading a file batch's input into jobs: while
    it lives nobody else does; once it lapses (its process died) the next sweep resumes."""
    return f"{batch(batch_id)}:ingest"


def batch_finalize(batch_id: str) -> str:
    """String (with a TTL) held while one batch task writes a finished batch's output files."""
    return f"{batch(batch_id)}:finalize"


def batch_output_settled(tenant_digest: str, batch_id: str) -> str:
    """Bitmap of a batch's lines (by index) whose output hold was replaced by the bytes their
    output line takes (web/batches/output_room.py): each line's is replaced once, by one script
    with the give-back, so it lives in the slot of the tenant's file holds."""
    return f"{files_of(tenant_digest)}:output-settled:{batch_id}"


def batches_of(tenant_digest: str) -> str:
    """Sorted set of a tenant's batch ids by creation time (``GET /v1/batches`` pages it);
    ``tenant_digest`` is the API key's digest, "" without keys."""
    return f"{PREFIX}:batches:{{{tenant_digest or 'open'}}}"


def batches_unsettled() -> str:
    """Sorted set of the batches not yet in a final stage, by creation time: what the batch
    sweep (web/batches/sweeper.py) resumes and settles."""
    return f"{PREFIX}:batches-unsettled"


def batch_sweep() -> str:
    """String (with a TTL of one sweep interval): the batch consumer sweeping now; the others
    skip that turn."""
    return f"{PREFIX}:batches-sweep"


def file(file_id: str) -> str:
    """Hash of a stored file's object: tenant, bytes, filename, purpose, times."""
    return f"{PREFIX}:file:{{{file_id}}}"


def file_chunks(file_id: str) -> str:
    """List of a file's bytes in fixed-size chunks, in order (read and written a chunk at a
    time, so neither an upload nor a download holds the whole file)."""
    return f"{file(file_id)}:chunks"


def file_readers(file_id: str) -> str:
    """Set of the batches reading the file as their input (until their reading ends): a file
    a batch is still reading cannot be deleted (409), so no batch is cut short silently."""
    return f"{file(file_id)}:readers"


def files_of(tenant_digest: str) -> str:
    """Sorted set of a tenant's file ids by creation time: listing and the per-key quota."""
    return f"{PREFIX}:files:{{{tenant_digest or 'open'}}}"


def files_held(tenant_digest: str) -> str:
    """Sorted set of what counts against a tenant's file storage (its files, uploads under
    way, batch outputs) by the moment each hold lapses; with ``files_held_bytes``, the per-key
    quota's one source, kept by a script (trickle/store/held_quota.py) so concurrent uploads cannot
    both take the last room."""
    return f"{files_of(tenant_digest)}:held"


def files_held_bytes(tenant_digest: str) -> str:
    """Hash of each held file's bytes (its metadata included)."""
    return f"{files_of(tenant_digest)}:held-bytes"


def batch_inputs_held(tenant_digest: str) -> str:
    """Sorted set of a tenant's live batches by the moment their input stops counting (the
    batch's expiry): ``limits.max_batch_input_bytes_per_key``'s holds, as ``files_held``."""
    return f"{batches_of(tenant_digest)}:held"


def batch_inputs_held_bytes(tenant_digest: str) -> str:
    """Hash of each live batch's input bytes."""
    return f"{batches_of(tenant_digest)}:held-bytes"


def idempotency_shard(scope: str, key: str) -> int:
    """The shard an idempotency key lives in; the jobs its request creates are drawn there, so
    the key and their records are written in one script on one slot (see ``idempotency``)."""
    return int(_idempotency_digest(scope, key)[:8], 16) % SHARDS


def idempotency(scope: str, key: str) -> str:
    """String: what the first request with this ``Idempotency-Key`` from this API key (the
    ``scope``, its digest) created, with its request's fingerprint. The header's value is
    hashed: any bytes a client sends make a well-formed key."""
    return f"{_tag(idempotency_shard(scope, key))}:idem:{_idempotency_digest(scope, key)}"


def _idempotency_digest(scope: str, key: str) -> str:
    return hashlib.sha256(f"{scope}\0{key}".encode()).hexdigest()


# Flask-Limiter's counters (web/admission/ratelimit.py): the `limits` library names them
# "<prefix>:LIMITER/<subject>/<requests|tokens>/<amount>/1/minute" (a string, 60 s TTL).
RATE_LIMIT_PREFIX = f"{PREFIX}:ratelimit"


def model_queue(model: str) -> str:
    """Celery queue that carries the ids of one model's jobs, at every priority."""
    return f"{PREFIX}.{model}"


def tenant_queue(model: str, tenant: str, index: int = 0) -> str:
    """Celery queue of one key's jobs for one model (its tenant name: never the key); a key of
    weight w has w of them (indexes 0..w-1), each one turn in the workers' round robin
    (trickle/queue.py). The default tenant (anonymous callers) uses ``model_queue``."""
    if not tenant:
        return model_queue(model)
    return f"{model_queue(model)}.key.{tenant}" + (f".{index}" if index else "")


# RabbitMQ only: the topic exchange every queue is bound to by its own name.
AMQP_EXCHANGE = PREFIX


def model_workers(model: str) -> str:
    """Sorted set of worker node names serving a model, scored by last heartbeat (unix time)."""
    return f"{PREFIX}:workers:{model}"


def worker_slots_key(node: str) -> str:
    """Hash of one worker's slots per model ("<busy>/<total>"); expires with its heartbeat."""
    return f"{PREFIX}:worker:{node}:slots"


def worker_outlook(node: str) -> str:
    """Hash of one worker's outlook per model (trickle/waiting.py: when its slots free, its
    pace); expires with its heartbeat."""
    return f"{PREFIX}:worker:{node}:outlook"


# Set (with a short TTL) while `trickle up --workers MIN:MAX` runs an autoscaler: zero live
# workers is then a ready state, since the autoscaler starts one when a job arrives.
AUTOSCALER = f"{PREFIX}:autoscaler"


# The generated HMAC key of stream tokens (when ``web.stream_secret`` is not set): created once
# with SET NX by whichever web process needs it first, then shared by all of them.
STREAM_SECRET = f"{PREFIX}:stream-secret"


def key_running(tenant: str) -> str:
    """Sorted set of a named key's running jobs over every worker (``max_running_jobs``):
    job id -> the time its entry lapses unless the job ends first (a dead worker's jobs)."""
    return f"{PREFIX}:key:{{{tenant}}}:running"
