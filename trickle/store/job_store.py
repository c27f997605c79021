"""JobStore: the only code that writes job state to Redis.

Jobs live in a hash (``keys.job``, encoded by ``trickle.jobs``), their tokens in a list
(``keys.job_tokens``, the replay log) and, while they run, the text streamed so far in a string
(``keys.job_output``), so reading a job never parses its log. Transitions that race (a worker
claiming a job while a client cancels it, a crashed worker's job being recovered while a stalled
one wakes up) are single Lua scripts (``store.scripts``), so each job has exactly one outcome
and only the current lease holder can write its tokens. The store holds the records, reads,
cancels and a worker's output; who holds a job is its ``leases`` (``store.leases``), composed,
as is the index of clients' deadlines (``store.deadlines``), and all run their scripts through
one ``ScriptRunner``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from typing import Any

from trickle import keys
from trickle.events import DONE_MESSAGE, RECORD_MESSAGE, TokenEvent, encode_text, token_message
from trickle.job_result import JobResult
from trickle.jobs import READ_FIELDS, Job, JobError, JobStatus, Usage, hash_fields, is_job_id
from trickle.store.deadlines import Deadlines
from trickle.store.flush_records import StepAppend as StepAppend
from trickle.store.flush_records import StepOutcome as StepOutcome
from trickle.store.flush_records import finish_outcome as finish_outcome
from trickle.store.leases import Leases
from trickle.store.script_runner import ScriptRunner, WriteRecorder, ending_keys


class CancelOutcome(str, Enum):
    MISSING = "missing"
    CANCELED = "canceled"  # it was still queued: canceled on the spot
    REQUESTED = "requested"  # it is running: the worker stops it at its next flush
    ALREADY_FINISHED = "finished"


class JobStore:
    """Every read and write of job state but its ownership, which is ``self.leases``."""

    def __init__(self, client: Any, result_ttl_seconds: int, queued_ttl_seconds: int):
        self.redis = client
        self.result_ttl_seconds = result_ttl_seconds
        self.queued_ttl_seconds = queued_ttl_seconds
        self._runner = ScriptRunner(client)
        self.cluster = self._runner.cluster
        self.leases = Leases(self._runner, result_ttl_seconds, queued_ttl_seconds)
        self.deadlines = Deadlines(self._runner, result_ttl_seconds)

    def pipeline(self) -> Any:
        """A pipeline for ``queue_step`` and ``queue_finish`` (per node on a cluster)."""
        return self._runner.pipeline()

    def scripts_lost(self) -> None:
        """A pipeline of this store's script calls met NOSCRIPT: load them again first."""
        self._runner.scripts_lost()

    # -- records ----------------------------------------------------------------------------------

    def create(self, job: Job, also: Callable[[Any], object] | None = None) -> None:
        """Record a new job; ``also`` adds commands for the same Redis to the same transaction
        (the web tier's task message: the record and its message arrive together, in one round
        trip, with no other request's work between them)."""
        self.create_many([job], also)

    def create_many(self, jobs: Iterable[Job], also: Callable[[Any], object] | None = None) -> None:
        """Record new jobs in one round trip (a batch can bring thousands); atomic on a single
        Redis, per job on a cluster (jobs live on different slots)."""
        pipe = self._runner.pipeline(transaction=not self.cluster)
        created = list(jobs)
        for job in created:
            self.queue_create(pipe, job)
        Deadlines.queue_next(pipe, created)
        if also is not None:
            also(pipe)
        pipe.execute()

    def create_once(
        self, key: str, record: str, ttl_seconds: int, writes: Callable[[Any], object]
    ) -> str | None:
        """Run ``writes`` (a request's records, queued on the recorder it is given) only if the
        idempotency ``key`` is new, in one script with the key's own ``record``; returns the
        key's existing record instead when it is not new. On a cluster every key written must
        share the idempotency key's slot (its jobs are drawn in its shard)."""
        recorder = WriteRecorder(key)
        writes(recorder)
        existing = self._runner.run(
            "CREATE_ONCE", recorder.keys, [record, ttl_seconds, json.dumps(recorder.writes)]
        )
        if existing is None:
            return None
        return existing.decode() if isinstance(existing, bytes) else str(existing)

    def create_jobs_once(
        self,
        key: str,
        record: str,
        ttl_seconds: int,
        jobs: Sequence[Job],
        also: Callable[[Any], object] | None = None,
    ) -> str | None:
        """``create_many`` under an idempotency key (``create_once``); ``also`` queues more
        writes on the same recorder (the jobs' task messages)."""

        def writes(recorder: Any) -> None:
            for job in jobs:
                self.queue_create(recorder, job)
            if not self.cluster:  # a cluster's script keeps to the idempotency key's slot
                Deadlines.queue_next(recorder, jobs)
            if also is not None:
                also(recorder)

        existing = self.create_once(key, record, ttl_seconds, writes)
        if existing is None and self.cluster:
            Deadlines.queue_next(self._runner.redis, jobs)  # a command on its own, if any
        return existing

    def delete_unpublished(self, job_ids: Sequence[str], idempotency_key: str = "") -> None:
        """Take back records whose task could not be published (the broker was down): no
        worker can have them, and the caller was told nothing was created (so the key that
        would have named them goes too)."""
        pipe = self._runner.pipeline(transaction=not self.cluster)
        for job_id in job_ids:
            pipe.delete(keys.job(job_id))
            pipe.zrem(keys.queued_jobs(keys.shard_of(job_id)), job_id)
            Deadlines.queue_unindex(pipe, job_id)
        if idempotency_key:
            pipe.delete(idempotency_key)
        pipe.execute()

    def queue_create(self, pipe: Any, job: Job) -> None:
        """Queue the writes of a new job's record on ``pipe`` (a pipeline or a WriteRecorder)."""
        pipe.hset(keys.job(job.id), mapping=job.to_hash())
        # Long enough to stay queued, then to be read as expired for a result TTL.
        kept = job.result_ttl_seconds or self.result_ttl_seconds
        pipe.expire(keys.job(job.id), self.queued_ttl_seconds + kept)
        queued = keys.queued_jobs(keys.shard_of(job.id))
        pipe.zadd(queued, {job.id: job.created_at + self.queued_ttl_seconds})
        Deadlines.queue_index(pipe, job)

    # -- reads ------------------------------------------------------------------------------------

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

    def tenant_digest(self, job_id: str) -> str | None:
        """The digest of the API key that created the job ("" without keys), None if the job
        does not exist: enough to tell a caller it may wait for the job."""
        if not is_job_id(job_id):
            return None
        status, tenant_digest = self.redis.hmget(keys.job(job_id), ["status", "tenant_digest"])
        return None if status is None else str(tenant_digest or "")

    def finished_many(self, job_ids: Sequence[str]) -> list[Job | None]:
        """Finished jobs' records in one round trip (a batch's output reads thousands); a job
        that is gone or not finished is None."""
        pipe = self._runner.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), READ_FIELDS)
        found: list[Job | None] = []
        for values in pipe.execute() if job_ids else []:
            fields = hash_fields(READ_FIELDS, values)
            job = Job.from_hash(fields) if "id" in fields else None
            found.append(job if job is not None and job.status.is_terminal else None)
        return found

    def snapshot(self, job_id: str, from_index: int) -> tuple[Job | None, list[TokenEvent]]:
        """The job (as ``get``) and its tokens from ``from_index`` on, read atomically."""
        return self._read(job_id, from_index)

    def tokens(self, job_id: str) -> list[TokenEvent]:
        """The whole replay log (to resume a job whose previous worker died mid-stream)."""
        entries = self.redis.lrange(keys.job_tokens(job_id), 0, -1)
        return [TokenEvent.from_log_entry(job_id, raw) for raw in entries]

    def _read(self, job_id: str, from_index: int | None) -> tuple[Job | None, list[TokenEvent]]:
        if not is_job_id(job_id):
            return None, []  # never a key built from a malformed id
        read_keys = [keys.job(job_id), keys.job_output(job_id), keys.job_tokens(job_id)]
        start = -1 if from_index is None else max(from_index, 0)
        values, output, logged, entries = self._runner.run("READ", read_keys, [start, *READ_FIELDS])
        fields = hash_fields(READ_FIELDS, values)
        if "id" not in fields:
            return None, []
        job = Job.from_hash(fields)
        if not job.status.is_terminal:
            job.output = output or ""
            job.usage = Usage(job.usage.prompt_tokens, int(logged))
        return job, [TokenEvent.from_log_entry(job_id, raw) for raw in entries or ()]

    # -- the queued and running indexes -----------------------------------------------------------

    def oldest_queued(self, count: int) -> list[str]:
        """The ids of up to ``count`` queued jobs with the earliest queue deadlines (the oldest
        submissions), over every shard."""
        found = self._runner.per_shard("zrange", keys.queued_jobs, 0, count - 1, withscores=True)
        entries = sorted((score, str(job_id)) for shard in found for job_id, score in shard)
        return [job_id for _score, job_id in entries[:count]]

    def queued_before(self, created_before: float) -> list[str]:
        """Queued jobs submitted before ``created_before`` (the index scores queue deadlines:
        submission + queued TTL)."""
        deadline = created_before + self.queued_ttl_seconds
        found = self._runner.per_shard("zrangebyscore", keys.queued_jobs, "-inf", repr(deadline))
        return [str(job_id) for shard in found for job_id in shard]

    def claim_republish(self, job_id: str, seconds: float) -> bool:
        """True for the one sweep that may publish this job's task again in ``seconds``."""
        lock = keys.job_republished(job_id)
        return bool(self.redis.set(lock, "1", nx=True, ex=max(int(seconds), 1)))

    def queue_position(self, job_id: str) -> int | None:
        """How many queued jobs (any model) were submitted before this one; None unless queued.

        An estimate, first come first counted: jobs of other models count too, and interactive
        jobs overtake batch jobs. (Queue deadlines order submissions: created + queue TTL.)
        """
        own = keys.queued_jobs(keys.shard_of(job_id))
        if not self.cluster:
            every = keys.every_shard(keys.queued_jobs)
            position = self._runner.run("QUEUE_POSITION", [own, *every], [job_id])
            return None if position is None else int(position)
        deadline = self.redis.zscore(own, job_id)
        if deadline is None:
            return None
        return self._runner.sum_per_shard("zcount", keys.queued_jobs, "-inf", f"({deadline!r}")

    def queued_count(self) -> int:
        """Jobs waiting for a worker, all models and priorities (the batch backlog bound)."""
        return self._runner.sum_per_shard("zcard", keys.queued_jobs)

    def running_count(self) -> int:
        return self._runner.sum_per_shard("zcard", keys.running_jobs)

    # -- transitions that end a job without its worker --------------------------------------------

    def cancel(self, job_id: str, now: float) -> CancelOutcome:
        return self.cancel_many([job_id], now)[0]

    def cancel_many(self, job_ids: Sequence[str], now: float) -> list[CancelOutcome]:
        """Cancel jobs in one round trip. CANCELED only for the call that canceled a queued
        job (once per job, however often it is asked): callers count on that."""
        valid = [job_id for job_id in job_ids if is_job_id(job_id)]
        runner = self._runner

        def build(pipe: Any) -> None:
            for job_id in valid:
                shard = keys.shard_of(job_id)
                runner.queue_script(
                    pipe,
                    "CANCEL",
                    [keys.job(job_id), keys.queued_jobs(shard), *ending_keys(job_id)],
                    [job_id, repr(now), self.result_ttl_seconds, runner.publish, DONE_MESSAGE],
                )

        replies = dict(zip(valid, runner.execute(build) if valid else [], strict=True))
        return [_cancel_outcome(replies.get(job_id, "missing")) for job_id in job_ids]

    def expire_queued(self, now: float) -> list[str]:
        """Fail queued jobs that waited past the queue TTL without any worker starting them."""
        expired = []
        overdue = self._runner.per_shard("zrangebyscore", keys.queued_jobs, "-inf", now)
        for job_id in [str(j) for shard in overdue for j in shard]:
            error = JobError(
                "queue_timeout",
                f"no worker started the job within {self.queued_ttl_seconds} s",
            )
            done = self._runner.run(
                "EXPIRE_QUEUED",
                [keys.job(job_id), keys.queued_jobs(keys.shard_of(job_id)), *ending_keys(job_id)],
                [
                    job_id,
                    repr(now),
                    json.dumps(error.to_dict()),
                    self.result_ttl_seconds,
                    self._runner.publish,
                    DONE_MESSAGE,
                ],
            )
            if done:
                expired.append(job_id)
        return expired

    # -- a worker's output, fenced by the lease it holds ------------------------------------------

    def set_prompt_tokens(self, job_id: str, prompt_tokens: int) -> None:
        self.redis.hset(keys.job(job_id), "prompt_tokens", str(prompt_tokens))

    def queue_step(self, pipe: Any, appends: Sequence[StepAppend]) -> int:
        """Add one flush of tokens to ``pipe``, fenced per job, each job's tokens published on
        its own channel. One script call for the whole flush on a single Redis; one per shard
        on a cluster (a script stays on one slot). Returns the number of calls queued."""
        groups = _by_shard(appends) if self.cluster else [list(appends)]
        for group in groups:
            script_keys: list[str] = []
            args: list[Any] = [self._runner.publish, len(group)]
            for append in group:
                script_keys += [
                    keys.job(append.job_id),
                    keys.job_tokens(append.job_id),
                    keys.job_lease(append.job_id),
                    keys.job_output(append.job_id),
                    keys.job_events_channel(append.job_id),
                ]
                first = "" if append.first_token_at is None else repr(append.first_token_at)
                events = append.events
                # Each text is JSON-encoded here once: the log entries and the channel message
                # are built from the same literals, and readers forward them as they are.
                literals = [encode_text(event.text) for event in events]
                args += [append.fence, first, events[0].index, len(events)]
                args += map(TokenEvent.log_entry, events, literals)
                args.append("".join(event.text for event in events))
                logprobs = [event.logprob for event in events]
                tops = [event.top for event in events]
                args.append(token_message(events[0].index, literals, logprobs, tops))
            self._runner.queue_script(pipe, "APPEND_STEP", script_keys, args)
        return len(groups)

    def step_outcome(self, appends: Sequence[StepAppend], *replies: Sequence[Any]) -> StepOutcome:
        """Read the reply of each of ``queue_step``'s calls (only exceptions come back)."""
        groups = _by_shard(appends) if self.cluster else [list(appends)]
        fenced_out: list[str] = []
        cancel_requested: list[str] = []
        short_logs: dict[str, int] = {}
        for group, reply in zip(groups, replies, strict=True):
            for position in reply:
                if isinstance(position, list):  # {i, the log's length}
                    short_logs[group[int(position[0]) - 1].job_id] = int(position[1])
                    continue
                append = group[abs(int(position)) - 1]
                (fenced_out if int(position) < 0 else cancel_requested).append(append.job_id)
        return StepOutcome(fenced_out, cancel_requested, short_logs)

    def queue_finish(
        self, pipe: Any, job_id: str, fence: str, result: JobResult, logged: int = 0
    ) -> None:
        """Add a job's final state to ``pipe``, if this worker holds the lease and the replay
        log has ``logged`` entries (the tokens the worker sent; see ``finish_outcome``)."""
        publish = self._runner.publish
        args: list[Any] = [job_id, fence, self.result_ttl_seconds, publish, RECORD_MESSAGE, logged]
        for name, value in result.to_hash().items():
            args += [name, value]
        self._runner.queue_script(
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

    def finish(self, job_id: str, fence: str, result: JobResult, logged: int = 0) -> bool:
        """Store a final state outside the token path (failures before generation)."""
        (reply,) = self._runner.execute(
            lambda pipe: self.queue_finish(pipe, job_id, fence, result, logged)
        )
        return finish_outcome(reply) is True


def _cancel_outcome(reply: str) -> CancelOutcome:
    if reply in ("missing", "canceled", "requested"):
        return CancelOutcome(reply)
    return CancelOutcome.ALREADY_FINISHED


def _by_shard(appends: Sequence[StepAppend]) -> list[list[StepAppend]]:
    """A flush's appends grouped by shard, in a stable order (replies are matched by position)."""
    groups: dict[int, list[StepAppend]] = {}
    for append in appends:
        groups.setdefault(keys.shard_of(append.job_id), []).append(append)
    return list(groups.values())
