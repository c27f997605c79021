"""A scheduler wired as a worker process wires it (real engine, real publisher, real Redis),
for the tests that drive batching, restarts and rebalancing without Celery."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import redis

from trickle.config.lanes import SpareUse
from trickle.config.sections import ModelSettings
from trickle.jobs import Job, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore
from worker.engine.engine import Engine
from worker.engine.new_job import make_scheduled_job
from worker.engine.prefix import PrefixTable, cache_partition
from worker.engine.scheduler import BatchScheduler, ScheduledJob
from worker.engine.sharing_gate import RefusalRate
from worker.engine.step_times import StepTimes
from worker.publisher import TokenPublisher


@dataclass(frozen=True)
class RestartPricing:
    """Fixed prices for the restart policy: seconds per decoding step by batch size (sizes in
    between interpolated) and per prompt token of a catch-up. A test of what the scheduler does
    with a split or a join fixes them, so whether the decision is taken does not depend on how
    the two cores were shared during the engine's warm-up or the run (the policy's pricing has
    its own unit tests, tests/unit/test_policy.py)."""

    step_seconds: dict[int, float]
    prefill_per_token: float


# A CPU-like profile (the demo model on this machine: ~2.5 ms a step alone, ~4.6 ms at 16).
CPU_LIKE = RestartPricing({1: 0.0025, 16: 0.0046}, prefill_per_token=0.00002)


class Harness:
    """An engine, a publisher and a scheduler, wired like a worker process."""

    def __init__(
        self,
        engine: Engine,
        client: redis.Redis,
        max_batch_size: int,
        wait_ms: float,
        rebatch_max_stall_ms: float = 0.0,
        quiet_start_after_ms: float = 0.0,
        publish_interval_ms: float = 0.0,
        rebatch_wait_ratio: float = 0.0,
        engine_threads: int = 1,
        publish_max_interval_ms: float = 0.0,
        publish_max_messages_per_second: float = 0.0,
        rebalance_gain_ratio: float = 0.0,
        prefixes: PrefixTable | None = None,
        pricing: RestartPricing | None = None,
        spare_lanes: int = 0,
        refusals: RefusalRate | None = None,
    ):
        """``spare_lanes``: overflow lanes, over every device (the engine must have them);
        ``refusals``: the grammar refusal rate the sharing gate reads (the engine's if None)."""
        self.engine = engine
        self.store = JobStore(client, result_ttl_seconds=60, queued_ttl_seconds=60)
        self.publisher = TokenPublisher(
            self.store,
            lambda job_id: None,
            lambda job_id: None,
            flush_interval_seconds=publish_interval_ms / 1000,
            max_interval_seconds=publish_max_interval_ms / 1000,
            max_messages_per_second=publish_max_messages_per_second,
        )
        self.scheduler = BatchScheduler(
            engine,
            self.publisher.publish_step,
            max_batch_size,
            max_batch_wait_ms=wait_ms,
            rebatch_max_stall_ms=rebatch_max_stall_ms,
            quiet_start_after_ms=quiet_start_after_ms,
            rebatch_wait_ratio=rebatch_wait_ratio,
            engine_threads=engine_threads,
            rebalance_gain_ratio=rebalance_gain_ratio,
            prefixes=prefixes,
            step_times=None if pricing is None else StepTimes(pricing.step_seconds, learn=False),
            prefill_seconds_per_token=None if pricing is None else pricing.prefill_per_token,
            spare_lanes=spare_lanes,
            spare_use=SpareUse.OVERFLOW,
            refusals=refusals,
        )

    def job(self, prompt: str, tenant_digest: str = "", **params: object) -> ScheduledJob:
        """A job stored and claimed as a worker would, so its writes carry a real fence;
        ``tenant_digest``: the API key digest it comes from (its prefix cache partition)."""
        options = GenerationParams(**params)  # type: ignore[arg-type]
        job = Job(new_job_id(), self.engine.settings.name, prompt, options, created_at=time.time())
        job.tenant_digest = tenant_digest
        self.store.create(job)
        claim = self.store.leases.claim(
            job.id, "harness", time.time(), lease_ms=60_000, max_attempts=3
        )
        assert claim.claimed
        ids = self.engine.tokenizer.encode(prompt)
        partition = cache_partition(tenant_digest, options.cache_salt)
        return make_scheduled_job(
            self.engine, job.id, ids, options, claim.fence, cache_partition=partition
        )

    def runner_then_newcomer(
        self, runner: ScheduledJob, newcomer: ScheduledJob, after_tokens: int, timeout: float
    ) -> None:
        """Start ``runner``, submit ``newcomer`` once it has ``after_tokens`` tokens, wait both."""
        self.scheduler.submit(runner)
        deadline = time.monotonic() + 30
        while runner.state.count < after_tokens:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        self.scheduler.submit(newcomer)
        assert runner.ended.wait(timeout) and newcomer.ended.wait(timeout)

    def run(self, jobs: list[ScheduledJob]) -> list[ScheduledJob]:
        for job in jobs:
            self.scheduler.submit(job)
        for job in jobs:
            assert job.ended.wait(60)
        return jobs

    def close(self) -> None:
        self.scheduler.close()
        self.publisher.close()


def engine_for(path: Path, name: str) -> Engine:
    return Engine(ModelSettings(name=name, path=str(path), device="cpu"))


def solo_outputs(engine: Engine, client: redis.Redis, specs: list[dict[str, object]]) -> list[str]:
    solo = Harness(engine, client, max_batch_size=1, wait_ms=0)
    try:
        return [solo.run([solo.job(**spec)])[0].state.output for spec in specs]  # type: ignore[arg-type]
    finally:
        solo.close()
