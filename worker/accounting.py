"""What a finished job leaves behind besides its stored result: metrics and one job-log line."""

from __future__ import annotations

from collections.abc import Mapping

from trickle.hop_timings import hop_seconds
from trickle.job_result import JobResult
from trickle.joblog import log_job_event
from trickle.jobs import Job
from trickle.telemetry.metric_defs import (
    E2E_LATENCY,
    HOP_TIME,
    INTER_TOKEN_LATENCY,
    JOBS,
    KEY_COMPLETION_TOKENS,
    KEY_JOBS,
    KEY_PROMPT_TOKENS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_MISSES,
    TIME_TO_FIRST_TOKEN,
    TOKENS,
)
from trickle.telemetry.metrics import MetricsRecorder
from trickle.tenants import DEFAULT_TENANT_LABEL
from worker.engine.scheduled import ScheduledJob


def observe_hops(metrics: MetricsRecorder, job: Job, result: JobResult, first: float) -> None:
    """One observation per hop the job went through (``deliver`` is the web tier's own)."""
    hops = hop_seconds(
        job.arrived_at or None,
        job.created_at,
        job.started_at,
        result.claimed_at,
        first,
        result.completed_at,
    )
    for hop, seconds in hops.items():
        metrics.observe(HOP_TIME, seconds, model=job.model, hop=hop)


def account_finished(
    metrics: MetricsRecorder,
    job: Job,
    attempt: int,
    result: JobResult,
    scheduled: ScheduledJob | None,
    resumed: int,
    key: str = DEFAULT_TENANT_LABEL,
    hops: Mapping[str, float] | None = None,
) -> None:
    """Count the job and its tokens (for its ``key`` too: the tenant's name), observe its
    latencies, and log how it ended.

    Tokens streamed by an earlier attempt (``resumed``) were counted by that attempt, and a
    resumed job's first token is not this attempt's: its TTFT is not observed.
    """
    model = job.model
    metrics.count(JOBS, model=model, status=result.status.value)
    generated = result.completion_tokens - resumed
    metrics.count(TOKENS, max(generated, 0), model=model)
    metrics.count(KEY_JOBS, key=key, model=model, status=result.status.value)
    metrics.count(KEY_PROMPT_TOKENS, job.usage.prompt_tokens, key=key, model=model)
    metrics.count(KEY_COMPLETION_TOKENS, max(generated, 0), key=key, model=model)
    e2e = result.completed_at - job.created_at
    metrics.observe(E2E_LATENCY, e2e, model=model)
    timings: dict[str, float] = {"e2e_seconds": e2e}
    first, last = (scheduled.first_token_at, scheduled.last_token_at) if scheduled else (None, None)
    if first is not None and resumed == 0:
        timings["ttft_seconds"] = first - (job.arrived_at or job.created_at)
        metrics.observe(TIME_TO_FIRST_TOKEN, timings["ttft_seconds"], model=model)
        observe_hops(metrics, job, result, first)
    notes: dict[str, object] = {}
    if scheduled is not None:
        timings["tokens_after_end"] = scheduled.tokens_after_end
        notes = {
            "lanes_at_arrival": scheduled.lanes_at_arrival,
            "started_in": scheduled.started_in,
            "restarts": scheduled.restarts,
        }
        if scheduled.prefix_hit is not None:
            hit = scheduled.prefix_hit
            metrics.count(PREFIX_CACHE_HITS if hit else PREFIX_CACHE_MISSES, model=model)
            timings["prefix_tokens"] = len(scheduled.request.prefix)
    if first is not None and last is not None and generated > 1:
        timings["itl_seconds"] = (last - first) / (generated - 1)
        metrics.observe(INTER_TOKEN_LATENCY, timings["itl_seconds"], model=model)
        timings["tokens_per_second"] = (generated - 1) / max(last - first, 1e-9)
    log_job_event(
        "finished",
        job.id,
        model,
        status=result.status.value,
        finish_reason=result.finish_reason.value,
        attempt=attempt,
        prompt_tokens=job.usage.prompt_tokens,
        completion_tokens=result.completion_tokens,
        error=result.error.type if result.error else None,
        **timings,
        **(hops or {}),
        **notes,
    )
