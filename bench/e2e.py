"""Trickle end to end over HTTP + SSE, measured from the client's side.

Each client POSTs ``/v1/jobs`` and then reads ``/v1/jobs/<id>/events`` to ``done``. TTFT runs
from just before the POST to the arrival of the first ``token`` event; tokens/s from the first
to the last token event; end-to-end from before the POST to ``done``.
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any

from bench.harness.httpio import SseEvent, follow_sse, parse_sse_block, request
from bench.harness.log import progress
from bench.harness.stack import CpuMeter
from bench.harness.stats import summary

STREAM_TIMEOUT_SECONDS = 600.0


@dataclass
class ClientRun:
    ok: bool
    error: str | None
    post_at: float  # perf_counter before the POST
    done_at: float | None
    ttft_s: float | None
    tokens: int
    first_to_last_s: float | None
    job: dict[str, Any] | None
    stream_intact: bool  # indexes 0..n-1 once each, text == stored output

    @property
    def tokens_per_s(self) -> float | None:
        if self.first_to_last_s and self.tokens > 1:
            return (self.tokens - 1) / self.first_to_last_s
        return None

    @property
    def end_to_end_s(self) -> float | None:
        return None if self.done_at is None else self.done_at - self.post_at


async def one_client(host: str, port: int, body: dict[str, Any]) -> ClientRun:
    post_at = time.perf_counter()
    try:
        response = await request(host, port, "POST", "/v1/jobs", body)
    except (OSError, TimeoutError) as exc:
        return ClientRun(False, f"POST failed: {exc!r}", post_at, None, None, 0, None, None, False)
    if response.status not in (200, 202):
        refused = f"POST answered {response.status}: {response.body[:300]!r}"
        return ClientRun(False, refused, post_at, None, None, 0, None, None, False)
    job_id = response.json()["id"]
    result = await follow_sse(host, port, f"/v1/jobs/{job_id}/events", STREAM_TIMEOUT_SECONDS)
    return _finished_run(post_at, result.events, result.error)


def _finished_run(post_at: float, events: list[SseEvent], error: str | None) -> ClientRun:
    """A client's run from its stream's events (``error``: what went wrong on the way)."""
    tokens = [event for event in events if event.event == "token"]
    dones = [event for event in events if event.event == "done"]
    job = json.loads(dones[0].data) if dones else None
    first = tokens[0].arrived if tokens else None
    ttft = None if first is None else first - post_at
    span = None if first is None else tokens[-1].arrived - first
    texts = [json.loads(event.data) for event in tokens]
    intact = [t["index"] for t in texts] == list(range(len(texts))) and (
        job is not None and "".join(t["text"] for t in texts) == job.get("output")
    )
    if job is not None and job.get("status") != "succeeded":
        error = f"job {job.get('status')}: {json.dumps(job.get('error'))}"
    done_at = dones[0].arrived if dones else None
    return ClientRun(error is None, error, post_at, done_at, ttft, len(tokens), span, job, intact)


class KeepAliveClient:
    """One HTTP/1.1 connection that POSTs a job and then reads its stream, kept from job to job
    as a browser or an SDK keeps its connection: a first token's time without a TCP connect, a
    server-side accept and a ``Connection: close`` per request."""

    def __init__(self, host: str, port: int):
        self._host, self._port = host, port
        self._conn = http.client.HTTPConnection(host, port, timeout=STREAM_TIMEOUT_SECONDS)

    def run(self, body: dict[str, Any]) -> ClientRun:
        post_at = time.perf_counter()
        try:
            self._conn.request(
                "POST", "/v1/jobs", json.dumps(body), {"Content-Type": "application/json"}
            )
            response = self._conn.getresponse()
            answer = json.loads(response.read())
            if response.status not in (200, 202):
                refused = f"POST answered {response.status}: {answer}"
                return ClientRun(False, refused, post_at, None, None, 0, None, None, False)
            path = f"/v1/jobs/{answer['id']}/events"
            self._conn.request("GET", path, headers={"Accept": "text/event-stream"})
            events = _read_events(self._conn.getresponse())
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.close()
            self._conn = http.client.HTTPConnection(
                self._host, self._port, timeout=STREAM_TIMEOUT_SECONDS
            )
            return ClientRun(False, repr(exc), post_at, None, None, 0, None, None, False)
        ended = any(event.event == "done" for event in events)
        return _finished_run(post_at, events, None if ended else "stream ended without done")

    def close(self) -> None:
        self._conn.close()


def _read_events(response: http.client.HTTPResponse) -> list[SseEvent]:
    """Each SSE event of a response, stamped when its block ended, read to the response's end."""
    events: list[SseEvent] = []
    lines: list[str] = []
    while raw := response.readline():
        line = raw.decode("utf-8").rstrip("\r\n")
        if line:
            lines.append(line)
            continue
        event = parse_sse_block("\n".join(lines), time.perf_counter())
        lines = []
        if event is not None:
            events.append(event)
    return events


def single_streams(host: str, port: int, body: dict[str, Any], runs: int) -> dict[str, Any]:
    """``runs`` streams one after another on an otherwise idle stack (after one warm-up)."""

    async def go() -> list[ClientRun]:
        await one_client(host, port, body)  # warm-up: tokenizer, pools, hub subscription
        return [await one_client(host, port, body) for _ in range(runs)]

    results = asyncio.run(go())
    ok = [r for r in results if r.ok]
    out: dict[str, Any] = {
        "runs": runs,
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "streams_intact": sum(r.stream_intact for r in ok),
        "ttft_ms": summary([r.ttft_s * 1000 for r in ok if r.ttft_s is not None]),
        "server_ttft_ms": summary(_server_ttfts_ms(ok)),
        "tokens_per_s": summary([r.tokens_per_s for r in ok if r.tokens_per_s is not None]),
        "worker_tokens_per_s": summary(_worker_rates(ok)),
        "end_to_end_tokens_per_s": summary(
            [r.tokens / r.end_to_end_s for r in ok if r.end_to_end_s]
        ),
        "tokens_per_run": sorted({r.tokens for r in ok}),
    }
    progress(
        f"single stream x{runs}: TTFT p50 {out['ttft_ms']['p50'] or 0:.1f} ms, "
        f"{out['tokens_per_s']['p50'] or 0:.0f} tok/s, {out['failed']} failed"
    )
    return out


def concurrent(
    host: str, port: int, body: dict[str, Any], clients: int, pids: dict[str, int] | None = None
) -> dict[str, Any]:
    """``clients`` streams started together: aggregate tokens/s and the TTFT spread."""

    async def go() -> list[ClientRun]:
        return list(await asyncio.gather(*(one_client(host, port, body) for _ in range(clients))))

    cpu = CpuMeter(pids or {})
    results = asyncio.run(go())
    cpu_percent = cpu.percent()
    ok = [r for r in results if r.ok]
    start = min(r.post_at for r in results)
    ends = [r.done_at for r in results if r.done_at is not None]
    wall = (max(ends) - start) if ends else None
    tokens = sum(r.tokens for r in ok)
    batches = infer_batches([r.job for r in ok if r.job is not None])
    out: dict[str, Any] = {
        "clients": clients,
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "streams_intact": sum(r.stream_intact for r in ok),
        "tokens": tokens,
        "wall_s": wall,
        "aggregate_tokens_per_s": tokens / wall if wall else None,
        "ttft_ms": summary([r.ttft_s * 1000 for r in ok if r.ttft_s is not None]),
        "server_ttft_ms": summary(_server_ttfts_ms(ok)),
        "per_stream_tokens_per_s": summary(
            [r.tokens_per_s for r in ok if r.tokens_per_s is not None]
        ),
        "batches_inferred": batches,
        "cpu_percent": cpu_percent,
        "detail": [_detail(r, start) for r in results],
    }
    progress(
        f"{clients} concurrent: {out['aggregate_tokens_per_s'] or 0:.0f} tok/s aggregate, "
        f"TTFT p50 {out['ttft_ms']['p50'] or 0:.0f} ms p99 {out['ttft_ms']['p99'] or 0:.0f} ms, "
        f"batches {batches}, {out['failed']} failed"
    )
    return out


def _detail(run: ClientRun, start: float) -> dict[str, Any]:
    """One client, compactly: client times from the first POST, the job's own timeline."""
    job = run.job or {}
    created = job.get("created_at")

    def since_created(name: str) -> float | None:
        value = job.get(name)
        return None if value is None or created is None else round(float(value) - created, 4)

    metrics = job.get("metrics") or {}
    ttft = metrics.get("time_to_first_token_seconds")
    return {
        "post_at": round(run.post_at - start, 4),
        "ttft": None if run.ttft_s is None else round(run.ttft_s, 4),
        "done_at": None if run.done_at is None else round(run.done_at - start, 4),
        "tokens": run.tokens,
        "status": job.get("status"),
        "job_started": since_created("started_at"),
        "job_first_token": ttft,
        "job_completed": since_created("completed_at"),
        "error": run.error,
    }


def _worker_rates(runs: list[ClientRun]) -> list[float]:
    """Tokens/s by the worker's own clock: first token -> job completed (no SSE, no client)."""
    rates = []
    for run in runs:
        job = run.job or {}
        ttft = (job.get("metrics") or {}).get("time_to_first_token_seconds")
        completed = job.get("completed_at")
        tokens = (job.get("usage") or {}).get("completion_tokens") or 0
        if ttft is None or completed is None or tokens < 2:
            continue
        span = float(completed) - (float(job["created_at"]) + float(ttft))
        if span > 0:
            rates.append((tokens - 1) / span)
    return rates


def _server_ttfts_ms(runs: list[ClientRun]) -> list[float]:
    values = []
    for run in runs:
        metrics = (run.job or {}).get("metrics") or {}
        ttft = metrics.get("time_to_first_token_seconds")
        if ttft is not None:
            values.append(float(ttft) * 1000)
    return values


def infer_batches(jobs: list[dict[str, Any]]) -> list[int]:
    """Batch sizes the worker ran, inferred from the jobs' first-token times.

    Jobs of one batch get their first token in the same decoding step; with one engine thread
    the next batch starts only after the previous one ended, so batches are separated by at
    least one job's generation time. Sizes in the order the batches ran.
    """
    points: list[tuple[float, float]] = []
    for job in jobs:
        metrics = job.get("metrics") or {}
        ttft = metrics.get("time_to_first_token_seconds")
        completed = job.get("completed_at")
        if ttft is None or completed is None:
            continue
        first = float(job["created_at"]) + float(ttft)
        points.append((first, float(completed) - first))
    if not points:
        return []
    points.sort()
    threshold = 0.5 * min(span for _, span in points)
    sizes = [1]
    for (previous, _), (current, _) in itertools.pairwise(points):
        if current - previous > threshold:
            sizes.append(1)
        else:
            sizes[-1] += 1
    return sizes


def warm_up(host: str, port: int, body: dict[str, Any]) -> None:
    """One job end to end, not measured (first-call allocations in a fresh worker)."""
    asyncio.run(one_client(host, port, body))
