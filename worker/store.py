"""JobStore: the only code that writes job state to Redis.

Jobs live in a hash (``keys.job``), their tokens in a list (``keys.job_tokens``) and, while they
run, the text streamed so far in a string (``keys.job_output``), so reading a job never parses
its log. Transitions
that race (a worker claiming a job while a client cancels it, a crashed worker's job being
recovered while a stalled one wakes up) are single Lua scripts (``worker.scripts``), so each job
has exactly one outcome and only the current lease holder can write its tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError

from worker import keys, scripts
from worker.events import DONE_MESSAGE, STATUS_MESSAGE, TokenEvent
from worker.job_records import (
    CLAIM_FIELDS,
    READ_FIELDS,
    CancelOutcome,
    Claim,
    ClaimOutcome,
    JobResult,
    RecoveryOutcome,
    ReleaseOutcome,
    StepAppend,
    StepOutcome,
    cancel_outcome,
    hash_fields,
    job_from_hash,
)
from worker.jobs import Job, JobError, JobStatus, Usage, is_job_id
from worker.node_pipeline import NodePipeline
from worker.redis_connection import is_cluster, publish_command

__all__ = [
    "CancelOutcome",
    "Claim",
    "ClaimOutcome",
    "JobResult",
    "JobStore",
    "RecoveryOutcome",
    "ReleaseOutcome",
    "StepAppend",
    "StepOutcome",
]


def _claim_from_reply(node: str, reply: list[Any]) -> Claim:
    """The CLAIM script's reply as a Claim: outcome, attempt, then the job's fields if taken."""
    outcome, attempt, *rest = reply
    values, logged, prompt = rest if rest else ([], 0, None)
    attempt = int(attempt)
    if outcome != "claimed":
        return Claim(ClaimOutcome(outcome), attempt, "")
    fields = hash_fields(CLAIM_FIELDS, values)
    if prompt:  # only when the worker must tokenize it (see CLAIM)
        fields["prompt"] = prompt
    return Claim(
        ClaimOutcome.CLAIMED, attempt, f"{node}:{attempt}", job_from_hash(fields), int(logged)
    )


def _ownership_keys(job_id: str) -> list[str]:
    """The keys CLAIM, RECOVER and RELEASE touch, in the order the scripts expect them."""
    shard = keys.shard_of(job_id)
    return [
        keys.job(job_id),
        keys.job_lease(job_id),
        keys.running_jobs(shard),
        keys.queued_jobs(shard),
        *_ending_keys(job_id),
    ]


def _ending_keys(job_id: str) -> list[str]:
    """What a transition that may end the job touches last: its replay log, its output so far
    and the two channels its done message goes to."""
    return [
        keys.job_tokens(job_id),
        keys.job_output(job_id),
        keys.job_events_channel(job_id),
        keys.job_done_channel(job_id),
    ]


class JobStore:
    def __init__(self, client: Any, result_ttl_seconds: int, queued_ttl_seconds: int):
        self.redis = client
        self.result_ttl_seconds = result_ttl_seconds
        self.queued_ttl_seconds = queued_ttl_seconds
        self.cluster = is_cluster(client)
        self.publish = publish_command(client)
        self._loaded = False
        self._scripts = {
            name: client.register_script(getattr(scripts, name))
            for name in (
                "CLAIM",
                "CANCEL",
                "RENEW",
                "RECOVER",
                "RELEASE",
                "EXPIRE_QUEUED",
                "APPEND_STEP",
                "FINISH",
                "SUM_PER_SHARD",
            )
        }

    def pipeline(self, transaction: bool = False) -> Any:
        """A pipeline that may carry script calls (per node on a cluster: ``node_pipeline``);
        a transaction must stay within one job's keys (one slot on a cluster)."""
        if self.cluster:
            return NodePipeline(self.redis, transaction)
        return self.redis.pipeline(transaction=transaction)

    def load_scripts(self) -> None:
        """Put every script in the server's cache (each primary's, on a cluster). Pipelines
        call scripts by digest alone: redis-py would otherwise ask SCRIPT EXISTS before every
        pipeline, a round trip per decoding step. A server that lost them (restarted, failed
        over) answers NOSCRIPT, and the caller loads them again and retries."""
        for script in self._scripts.values():
            script.sha = self.redis.script_load(script.script)
        self._loaded = True

    def queue_script(self, pipe: Any, name: str, script_keys: list[str], args: list[Any]) -> None:
        """Add one script call to ``pipe`` (loading the scripts first, once per store)."""
        if not self._loaded:
            self.load_scripts()
        pipe.evalsha(self._scripts[name].sha, len(script_keys), *script_keys, *args)

    def execute(self, build: Callable[[Any], None]) -> list[Any]:
        """Build and run a pipeline of script calls; once more if the server lacked them (each
        script is a guarded transition: a call that ran already is refused or repeated as a
        no-op)."""
        for attempt in (1, 2):
            pipe = self.pipeline()
            build(pipe)
            try:
                return list(pipe.execute())
            except NoScriptError:
                if attempt == 2:
                    raise
                self.scripts_lost()
        raise AssertionError("unreachable")

    def scripts_lost(self) -> None:
        """The server answered NOSCRIPT: the next script call loads them all again."""
        self._loaded = False

    # -- web side -------------------------------------------------------------------------------

    def create(self, job: Job, also: Callable[[Any], object] | None = None) -> None:
        """Record a new job; ``also`` adds commands for the same Redis to the same transaction
        (the web tier's task message: the record and its message arrive together, in one round
        trip, with no other request's work between them)."""
        self.create_many([job], also)

    def create_many(self, jobs: Sequence[Job], also: Callable[[Any], object] | None = None) -> None:
        """Record new jobs in one round trip (a batch can bring thousands); atomic on a single
        Redis, per job on a cluster (jobs live on different slots)."""
        pipe = self.pipeline(transaction=not self.cluster)
        for job in jobs:
            self._queue_create(pipe, job)
        if also is not None:
            also(pipe)
        pipe.execute()

    def _queue_create(self, pipe: Any, job: Job) -> None:
        fields: dict[Any, Any] = {
            "id": job.id,
            "model": job.model,
            "prompt": job.prompt,
            "params": json.dumps(job.params.to_dict()),
            "status": job.status.value,
            "created_at": repr(job.created_at),
            "prompt_tokens": str(job.usage.prompt_tokens),
            "attempts": "0",
        }
        if job.owner:
            fields["owner_key"] = job.owner
        if job.priority:
            fields["priority"] = str(job.priority)
        if job.webhook_url:
            fields["webhook_url"] = job.webhook_url
        if job.prompt_ids:
            fields["prompt_ids"] = " ".join(map(str, job.prompt_ids))
        if job.trace_context:
            fields["traceparent"] = job.trace_context
        pipe.hset(keys.job(job.id), mapping=fields)
        # Long enough to stay queued, then to be read as expired for a result TTL.
        pipe.expire(keys.job(job.id), self.queued_ttl_seconds + self.result_ttl_seconds)
        queued = keys.queued_jobs(keys.shard_of(job.id))
        pipe.zadd(queued, {job.id: job.created_at + self.queued_ttl_seconds})

    def model_of(self, job_id: str) -> str:
        """The job's model, for metrics and logs ("unknown" once the job has expired)."""
        return str(self.redis.hget(keys.job(job_id), "model") or "unknown")

    def get(self, job_id: str) -> Job | None:
        """The job as served: a finished job's stored output, a running one's output so far
        (one string read), never the replay log, nor the prompt (only the worker needs it)."""
        job, _events = self._read(job_id, None)
        return job

    def status(self, job_id: str) -> JobStatus | None:
        """Just the status (a waiter polling for the end reads a few bytes, not the job)."""
        if not is_job_id(job_id):
            return None
        value = self.redis.hget(keys.job(job_id), "status")
        return JobStatus(value) if value else None

    def owner(self, job_id: str) -> str | None:
        """The digest of the API key that created the job ("" without keys), None if the job
        does not exist: enough to tell a caller it may wait for the job."""
        if not is_job_id(job_id):
            return None
        status, owner = self.redis.hmget(keys.job(job_id), ["status", "owner_key"])
        return None if status is None else str(owner or "")

    def snapshot(self, job_id: str, from_index: int) -> tuple[Job | None, list[TokenEvent]]:
        """The job (as ``get``) and its tokens from ``from_index`` on, read atomically."""
        return self._read(job_id, from_index)

    def _read(self, job_id: str, from_index: int | None) -> tuple[Job | None, list[TokenEvent]]:
        if not is_job_id(job_id):
            return None, []  # never a key built from a malformed id
        pipe = self.pipeline(transaction=True)
        pipe.hmget(keys.job(job_id), READ_FIELDS)
        pipe.get(keys.job_output(job_id))
        pipe.llen(keys.job_tokens(job_id))
        if from_index is not None:
            pipe.lrange(keys.job_tokens(job_id), from_index, -1)
        values, output, logged, *tail = pipe.execute()
        fields = hash_fields(READ_FIELDS, values)
        if "id" not in fields:
            return None, []
        job = job_from_hash(fields)
        if not job.status.is_terminal:
            job.output = output or ""
            job.usage = Usage(job.usage.prompt_tokens, int(logged))
        entries = tail[0] if tail else []
        return job, [TokenEvent.from_log_entry(job_id, raw) for raw in entries]

    def oldest_queued(self, count: int) -> list[str]:
        """The ids of up to ``count`` queued jobs with the earliest queue deadlines (the oldest
        submissions), over every shard."""
        found = self._per_shard("zrange", keys.queued_jobs, 0, count - 1, withscores=True)
        entries = sorted((score, str(job_id)) for shard in found for job_id, score in shard)
        return [job_id for _score, job_id in entries[:count]]

    def queue_position(self, job_id: str) -> int | None:
        """How many queued jobs (any model) were submitted before this one; None unless queued.

        An estimate, first come first counted: jobs of other models count too, and interactive
        jobs overtake batch jobs. (Queue deadlines order submissions: created + queue TTL.)
        """
        deadline = self.redis.zscore(keys.queued_jobs(keys.shard_of(job_id)), job_id)
        if deadline is None:
            return None
        return self._sum_per_shard("zcount", keys.queued_jobs, "-inf", f"({deadline!r}")

    def queued_count(self) -> int:
        """Jobs waiting for a worker, all models and priorities (the batch backlog bound)."""
        return self._sum_per_shard("zcard", keys.queued_jobs)

    def running_count(self) -> int:
        return self._sum_per_shard("zcard", keys.running_jobs)

    def running_ids(self) -> list[str]:
        """Every job some worker holds (or held, until a sweep notices it died)."""
        members = self._per_shard("zrange", keys.running_jobs, 0, -1)
        return [str(job_id) for shard in members for job_id in shard]

    def _sum_per_shard(self, command: str, key: Callable[[int], str], *args: Any) -> int:
        """The sum of a counting command over every shard's index. On a single server one
        script loops over them: a pipeline of 256 commands cost milliseconds of Python (on
        every stream that starts while its job is queued, for its position)."""
        if self.cluster:
            return int(sum(self._per_shard(command, key, *args)))
        shards = [key(shard) for shard in range(keys.SHARDS)]
        (total,) = self.execute(
            lambda pipe: self.queue_script(pipe, "SUM_PER_SHARD", shards, [command, *args])
        )
        return int(total)

    def _per_shard(self, command: str, key: Any, *args: Any, **options: Any) -> list[Any]:
        """One command per shard's index, in one pipelined round trip (per node on a cluster)."""
        pipe = self.pipeline()
        for shard in range(keys.SHARDS):
            getattr(pipe, command)(key(shard), *args, **options)
        return list(pipe.execute())

    def cancel(self, job_id: str, now: float) -> CancelOutcome:
        return self.cancel_many([job_id], now)[0]

    def cancel_many(self, job_ids: Sequence[str], now: float) -> list[CancelOutcome]:
        """Cancel jobs in one round trip. CANCELED only for the call that canceled a queued
        job (once per job, however often it is asked): callers count on that."""
        valid = [job_id for job_id in job_ids if is_job_id(job_id)]

        def build(pipe: Any) -> None:
            for job_id in valid:
                shard = keys.shard_of(job_id)
                self.queue_script(
                    pipe,
                    "CANCEL",
                    [keys.job(job_id), keys.queued_jobs(shard), *_ending_keys(job_id)],
                    [job_id, repr(now), self.result_ttl_seconds, self.publish, DONE_MESSAGE],
                )

        replies = dict(zip(valid, self.execute(build) if valid else [], strict=True))
        return [cancel_outcome(replies.get(job_id, "missing")) for job_id in job_ids]

    # -- worker side: ownership -----------------------------------------------------------------

    def claim(self, job_id: str, node: str, now: float, lease_ms: int, max_attempts: int) -> Claim:
        """Take a queued job under a lease; the fence ("<node>:<attempt>") guards every write.

        Beyond ``max_attempts`` claims (its workers kept dying) the job fails instead.
        """
        (claim,) = self.claim_many([job_id], node, now, lease_ms, max_attempts)
        return claim

    def claim_many(
        self, job_ids: Sequence[str], node: str, now: float, lease_ms: int, max_attempts: int
    ) -> list[Claim]:
        """``claim`` for several jobs in one round trip (what a job feeder took at once)."""
        error = JobError(
            "worker_lost",
            f"the job was attempted {max_attempts} times and its worker died each time",
        )
        shared = [
            repr(now),
            node,
            lease_ms,
            max_attempts,
            json.dumps(error.to_dict()),
            self.result_ttl_seconds,
            self.publish,
            DONE_MESSAGE,
            STATUS_MESSAGE,
            *CLAIM_FIELDS,
        ]

        def build(pipe: Any) -> None:
            for job_id in job_ids:
                self.queue_script(pipe, "CLAIM", _ownership_keys(job_id), [job_id, *shared])

        return [_claim_from_reply(node, reply) for reply in self.execute(build)]

    def tokens(self, job_id: str) -> list[TokenEvent]:
        """The whole replay log (to resume a job whose previous worker died mid-stream)."""
        entries = self.redis.lrange(keys.job_tokens(job_id), 0, -1)
        return [TokenEvent.from_log_entry(job_id, raw) for raw in entries]

    def renew(self, leases: dict[str, str], lease_ms: int) -> list[str]:
        """Extend the leases this worker holds; returns the jobs whose lease it lost."""
        if not leases:
            return []

        def build(pipe: Any) -> None:
            for job_id, fence in leases.items():
                self.queue_script(pipe, "RENEW", [keys.job_lease(job_id)], [fence, lease_ms])

        results = self.execute(build)
        return [job_id for job_id, ok in zip(leases, results, strict=True) if not ok]

    def release(self, job_id: str, fence: str, now: float) -> ReleaseOutcome:
        """Hand a claimed, not yet started job back (graceful shutdown).

        Returns "queued" (requeue it), "canceled" (a cancel was pending) or "lost" (not ours).
        """
        outcome = self._scripts["RELEASE"](
            keys=_ownership_keys(job_id),
            args=[
                job_id,
                fence,
                now + self.queued_ttl_seconds,
                repr(now),
                self.result_ttl_seconds,
                self.publish,
                DONE_MESSAGE,
                STATUS_MESSAGE,
            ],
        )
        return {1: ReleaseOutcome.QUEUED, 2: ReleaseOutcome.CANCELED}.get(
            int(outcome), ReleaseOutcome.LOST
        )

    def recover_orphans(self, now: float) -> dict[str, RecoveryOutcome]:
        """Requeue running jobs whose lease expired (their worker died): id -> outcome."""
        outcomes: dict[str, RecoveryOutcome] = {}
        for job_id in self.running_ids():
            outcome = self._scripts["RECOVER"](
                keys=_ownership_keys(job_id),
                args=[
                    job_id,
                    repr(now),
                    now + self.queued_ttl_seconds,
                    self.result_ttl_seconds,
                    self.publish,
                    DONE_MESSAGE,
                    STATUS_MESSAGE,
                ],
            )
            if outcome != "alive":
                outcomes[job_id] = RecoveryOutcome(outcome)
        return outcomes

    def expire_queued(self, now: float) -> list[str]:
        """Fail queued jobs that waited past the queue TTL without any worker starting them."""
        expired = []
        overdue = self._per_shard("zrangebyscore", keys.queued_jobs, "-inf", now)
        for job_id in [str(j) for shard in overdue for j in shard]:
            error = JobError(
                "queue_timeout",
                f"no worker started the job within {self.queued_ttl_seconds} s",
            )
            done = self._scripts["EXPIRE_QUEUED"](
                keys=[
                    keys.job(job_id),
                    keys.queued_jobs(keys.shard_of(job_id)),
                    *_ending_keys(job_id),
                ],
                args=[
                    job_id,
                    repr(now),
                    json.dumps(error.to_dict()),
                    self.result_ttl_seconds,
                    self.publish,
                    DONE_MESSAGE,
                ],
            )
            if done:
                expired.append(job_id)
        return expired

    # -- worker side: output --------------------------------------------------------------------

    def set_prompt_tokens(self, job_id: str, prompt_tokens: int) -> None:
        self.redis.hset(keys.job(job_id), "prompt_tokens", str(prompt_tokens))

    def queue_step(self, pipe: Any, appends: Sequence[StepAppend]) -> int:
        """Add one flush of tokens to ``pipe``, fenced per job, each job's tokens published on
        its own channel. One script call for the whole flush on a single Redis; one per shard
        on a cluster (a script stays on one slot). Returns the number of calls queued."""
        groups = _by_shard(appends) if self.cluster else [list(appends)]
        for group in groups:
            script_keys: list[str] = []
            args: list[Any] = [self.publish, len(group)]
            for append in group:
                script_keys += [
                    keys.job(append.job_id),
                    keys.job_tokens(append.job_id),
                    keys.job_lease(append.job_id),
                    keys.job_output(append.job_id),
                    keys.job_events_channel(append.job_id),
                ]
                first = "" if append.first_token_at is None else repr(append.first_token_at)
                encoded = [event.encoded() for event in append.events]
                args += [append.fence, first, append.events[0].index, len(append.events)]
                args += [entry for entry, _item in encoded]
                args.append("".join(event.text for event in append.events))
                args.append('{"t":[' + ",".join(item for _entry, item in encoded) + "]}")
            self.queue_script(pipe, "APPEND_STEP", script_keys, args)
        return len(groups)

    def step_outcome(self, appends: Sequence[StepAppend], *replies: Sequence[Any]) -> StepOutcome:
        """Read the reply of each of ``queue_step``'s calls (only exceptions come back)."""
        groups = _by_shard(appends) if self.cluster else [list(appends)]
        fenced_out: list[str] = []
        cancel_requested: list[str] = []
        for group, reply in zip(groups, replies, strict=True):
            for position in reply:
                append = group[abs(int(position)) - 1]
                (fenced_out if int(position) < 0 else cancel_requested).append(append.job_id)
        return StepOutcome(fenced_out=fenced_out, cancel_requested=cancel_requested)

    def queue_finish(self, pipe: Any, job_id: str, fence: str, result: JobResult) -> None:
        """Add a job's final state to ``pipe``; ignored unless this worker holds the lease."""
        args: list[Any] = [job_id, fence, self.result_ttl_seconds, self.publish, DONE_MESSAGE]
        for name, value in result.fields().items():
            args += [name, value]
        self.queue_script(
            pipe,
            "FINISH",
            [
                keys.job(job_id),
                keys.job_tokens(job_id),
                keys.job_lease(job_id),
                keys.running_jobs(keys.shard_of(job_id)),
                keys.job_output(job_id),
                keys.job_events_channel(job_id),
                keys.job_done_channel(job_id),
            ],
            args,
        )

    def finish(self, job_id: str, fence: str, result: JobResult) -> bool:
        """Store a final state outside the token path (failures before generation)."""
        (stored,) = self.execute(lambda pipe: self.queue_finish(pipe, job_id, fence, result))
        return bool(stored)


def _by_shard(appends: Sequence[StepAppend]) -> list[list[StepAppend]]:
    """A flush's appends grouped by shard, in a stable order (replies are matched by position)."""
    groups: dict[int, list[StepAppend]] = {}
    for append in appends:
        groups.setdefault(keys.shard_of(append.job_id), []).append(append)
    return list(groups.values())
