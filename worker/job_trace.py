"""The worker's share of a job's trace: its hops as spans, and vLLM-style ``gen_ai`` latencies.

Recorded once, when the job ends, from the moments the worker noted on the way; the span named
``llm_request`` carries the same ``gen_ai.*`` attributes vLLM puts on its request span.
"""

from __future__ import annotations

from typing import Any

from trickle.job_result import JobResult
from trickle.jobs import Job
from trickle.telemetry.tracing import JobTimeline, Tracing


def record_job_trace(
    tracing: Tracing, job: Job, result: JobResult, timeline: JobTimeline, attempt: int
) -> None:
    end = result.completed_at
    first = timeline.first_token
    attributes: dict[str, Any] = {
        "gen_ai.request.id": job.id,
        "gen_ai.response.model": job.model,
        "gen_ai.request.max_tokens": job.params.max_tokens,
        "gen_ai.request.temperature": job.params.temperature,
        "gen_ai.request.top_p": job.params.top_p,
        "gen_ai.usage.prompt_tokens": job.usage.prompt_tokens,
        "gen_ai.usage.completion_tokens": result.completion_tokens,
        "gen_ai.response.finish_reasons": [result.finish_reason.value],
        "gen_ai.latency.e2e": end - job.created_at,
        "gen_ai.latency.time_in_queue": timeline.claim_started - job.created_at,
        "trickle.attempt": attempt,
        "trickle.status": result.status.value,
    }
    if timeline.batch_started is not None and timeline.scheduled is not None:
        attributes["gen_ai.latency.time_in_scheduler"] = timeline.batch_started - timeline.scheduled
    if first is not None and timeline.batch_started is not None:
        attributes["gen_ai.latency.time_to_first_token"] = first - job.created_at
        attributes["gen_ai.latency.time_in_model_prefill"] = first - timeline.batch_started
        if timeline.last_token is not None:
            attributes["gen_ai.latency.time_in_model_decode"] = timeline.last_token - first
    request = tracing.record(job.trace_context, "llm_request", job.created_at, end, attributes)
    for name, start, stop in hops(job, timeline):
        tracing.record(request, name, start, stop)


def hops(job: Job, timeline: JobTimeline) -> list[tuple[str, float, float]]:
    """The hops of one attempt that it lived through, as (name, start, end) wall-clock times."""
    spans: list[tuple[str, float | None, float | None]] = [
        ("queue wait", job.created_at, timeline.claim_started),
        ("claim", timeline.claim_started, timeline.claimed),
        ("batch wait", timeline.scheduled, timeline.batch_started),
        ("first step", timeline.batch_started, timeline.first_token),
        ("first publish", timeline.first_token, timeline.first_published),
        ("generate", timeline.batch_started, timeline.last_token),
    ]
    return [(name, start, end) for name, start, end in spans if start and end]


def logged_hop_seconds(job: Job, timeline: JobTimeline) -> dict[str, float]:
    """The hops' durations for the job log (``queue_wait_seconds``...): where a slow first token
    waited, without a trace collector (``bench.outside`` reads them for its worst arrivals)."""
    return {
        f"{name.replace(' ', '_')}_seconds": end - start for name, start, end in hops(job, timeline)
    }
