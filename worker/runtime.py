"""Everything one worker process holds: Redis, the publisher, and a loaded engine per model.

Built once per process (models are loaded once) and used by every Celery task thread.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from worker import keys
from worker.config import Settings
from worker.engine import Engine
from worker.jobs import FinishReason, Job, JobError, JobStatus
from worker.publisher import TokenPublisher
from worker.scheduler import BatchScheduler, ScheduledJob, make_scheduled_job
from worker.store import JobResult, JobStore

log = logging.getLogger(__name__)


def redis_client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(
        settings.redis.url,
        decode_responses=True,
        socket_timeout=settings.redis.socket_timeout_seconds,
        socket_connect_timeout=settings.redis.socket_timeout_seconds,
        health_check_interval=30,
    )


class WorkerRuntime:
    def __init__(self, settings: Settings, node_name: str = "worker"):
        self.settings = settings
        self.node_name = node_name
        self.redis = redis_client(settings)
        self.store = JobStore(
            self.redis, settings.limits.result_ttl_seconds, settings.limits.queued_ttl_seconds
        )
        self._in_flight: dict[str, ScheduledJob] = {}
        self._lock = threading.Lock()
        self.publisher = TokenPublisher(self.store, self._cancel_requested)
        self.engines: dict[str, Engine] = {}
        self.schedulers: dict[str, BatchScheduler] = {}
        for name in settings.served_models():
            model = settings.model(name)
            engine = Engine(model)
            self.engines[name] = engine
            self.schedulers[name] = BatchScheduler(
                engine,
                self.publisher.publish_step,
                max_batch_size=model.max_batch_size,
                max_batch_wait_ms=model.max_batch_wait_ms,
                engine_threads=model.inter_threads,
            )
            log.info("model %s loaded from %s on %s", name, model.path, engine.device)
        self._stop_heartbeat = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._heartbeat_loop, name="trickle-heartbeat", daemon=True
        )

    def start_heartbeat(self) -> None:
        """Announce this worker per model, so /readyz knows someone consumes the queue."""
        self._beat()
        self._heartbeat.start()

    def close(self) -> None:
        self._stop_heartbeat.set()
        for scheduler in self.schedulers.values():
            scheduler.close()
        self.publisher.close()
        for engine in self.engines.values():
            engine.close()
        try:
            for name in self.engines:
                self.redis.zrem(keys.model_workers(name), self.node_name)
        except redis.RedisError:
            log.warning("could not withdraw heartbeat for %s", self.node_name)

    def run_job(self, job_id: str) -> None:
        """Claim, generate and store one job; returns once its final state is in Redis."""
        job = self.store.get(job_id)
        if job is None:
            log.warning("job %s vanished before it ran (expired or deleted)", job_id)
            return
        claim = self.store.claim(job_id, time.time())
        if claim != "claimed":
            log.info("job %s not run: status was %s", job_id, claim)
            return
        try:
            scheduled = self._schedule(job)
        except ValueError as exc:
            self._fail(job_id, JobError("invalid_request", str(exc)))
            return
        scheduled.ended.wait()
        with self._lock:
            self._in_flight.pop(job_id, None)
        state = scheduled.state
        if scheduled.error is not None:
            error = JobError("engine_error", str(scheduled.error))
            self._fail(job_id, error, state.output, state.count)
            return
        reason = state.finish_reason or FinishReason.LENGTH
        status = JobStatus.CANCELED if reason is FinishReason.CANCELED else JobStatus.SUCCEEDED
        result = JobResult(status, state.output, reason, state.count, time.time())
        self.publisher.publish_finish(job_id, result).wait()

    def _schedule(self, job: Job) -> ScheduledJob:
        engine = self.engines.get(job.model)
        if engine is None:
            raise ValueError(f"this worker does not serve model {job.model!r}")
        prompt_ids = engine.tokenizer.encode(job.prompt)
        limit = engine.settings.max_context_tokens
        if len(prompt_ids) + job.params.max_tokens > limit:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({job.params.max_tokens}) "
                f"exceeds the model's context of {limit} tokens"
            )
        self.store.set_prompt_tokens(job.id, len(prompt_ids))
        scheduled = make_scheduled_job(engine, job.id, prompt_ids, job.params)
        with self._lock:
            self._in_flight[job.id] = scheduled
        self.schedulers[job.model].submit(scheduled)
        return scheduled

    def _fail(self, job_id: str, error: JobError, output: str = "", tokens: int = 0) -> None:
        """Mark a job failed; output keeps whatever was already streamed, so the two agree."""
        log.error("job %s failed: %s: %s", job_id, error.type, error.message)
        result = JobResult(JobStatus.FAILED, output, FinishReason.ERROR, tokens, time.time(), error)
        self.store.finish(job_id, result)

    def _cancel_requested(self, job_id: str) -> None:
        with self._lock:
            scheduled = self._in_flight.get(job_id)
        if scheduled is not None:
            scheduled.state.cancel_requested.set()

    def _heartbeat_loop(self) -> None:
        while not self._stop_heartbeat.wait(self.settings.worker.heartbeat_seconds):
            try:
                self._beat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)

    def _beat(self) -> None:
        now = time.time()
        stale = now - self.settings.worker.heartbeat_ttl_seconds
        pipe = self.redis.pipeline(transaction=False)
        for name in self.engines:
            pipe.zadd(keys.model_workers(name), {self.node_name: now})
            pipe.zremrangebyscore(keys.model_workers(name), "-inf", stale)
        pipe.execute()
