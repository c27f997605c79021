"""The fast path's latency budget: one stream at a time, every hop from its trace.

    .venv/bin/python -m bench.budget [--model demo,bench] [--runs 30] [--max-tokens 256]

For each model, in one run: CTranslate2 alone (its best single-stream compute type and threads,
and the worker's own configuration), then the stack as ``make up`` runs it (own Redis, one
Celery worker, gunicorn, Trickle's defaults) exporting OpenTelemetry traces to an in-process
OTLP/HTTP receiver. A client that keeps its connections open POSTs greedy ``ignore_eos`` jobs
and reads each one's SSE stream; TTFT runs from just before the POST to the first ``token``
event. The table gives p50/p99 per hop (from the spans), beside the end-to-end figures.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.engine_limit import load_generator, stream_once
from bench.harness import models
from bench.harness.log import progress
from bench.harness.params import RunParams
from bench.harness.stack import HOST, Stack
from bench.harness.stats import percentile, summary
from tests.otlp_sink import ReceivedSpan, SpanSink
from trickle.config.sections import available_cores
from trickle.config.settings import PROJECT_ROOT
from worker.engine.model_hints import resolve_compute_type

ENGINE_RUNS = 10  # per engine variant: the medians settle quickly, and five variants run
HOPS = (
    "validate",
    "enqueue",
    "queue wait",
    "claim",
    "batch wait",
    "first step",
    "first publish",
    "first delivery",
)


@dataclass
class StreamRun:
    job_id: str
    post_s: float  # before the POST -> its response
    ttft_s: float  # before the POST -> first token event
    tokens: int
    tokens_per_s: float
    intact: bool  # indexes 0..n-1 once each, text == the stored output
    new_connections: int


class KeepAliveClient:
    """Two HTTP/1.1 connections kept open: one for POSTs, one for the streams."""

    def __init__(self, port: int):
        self.port = port
        self._post = http.client.HTTPConnection(HOST, port, timeout=60)
        self._stream = http.client.HTTPConnection(HOST, port, timeout=600)
        self.connects = 0

    def _send(self, conn: http.client.HTTPConnection, *args: Any, **kw: Any) -> None:
        if conn.sock is None:
            self.connects += 1
        conn.request(*args, **kw)

    def run(self, body: dict[str, Any]) -> StreamRun:
        before = self.connects
        payload = json.dumps(body)
        start = time.perf_counter()
        self._send(self._post, "POST", "/v1/jobs", payload, {"Content-Type": "application/json"})
        response = self._post.getresponse()
        data = json.loads(response.read())
        posted = time.perf_counter()
        if response.status != 202:
            raise RuntimeError(f"POST answered {response.status}: {data}")
        job_id = data["id"]
        self._send(self._stream, "GET", f"/v1/jobs/{job_id}/events")
        stream = self._stream.getresponse()
        arrivals: list[float] = []
        texts: list[tuple[int, str]] = []
        done: dict[str, Any] = {}
        event: dict[str, str] = {}
        while True:
            line = stream.readline()
            if not line:
                break
            text = line.decode().rstrip("\r\n")
            if text:
                name, _, value = text.partition(": ")
                event[name] = value
                continue
            if event.get("event") == "token":
                arrivals.append(time.perf_counter())
                token = json.loads(event["data"])
                texts.append((token["index"], token["text"]))
            elif event.get("event") == "done":
                done = json.loads(event["data"])
            event = {}
        stream.read()
        if stream.will_close:
            self._stream.close()
        intact = [i for i, _ in texts] == list(range(len(texts))) and "".join(
            t for _, t in texts
        ) == done.get("output")
        span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
        return StreamRun(
            job_id,
            posted - start,
            arrivals[0] - start,
            len(arrivals),
            (len(arrivals) - 1) / span if span else 0.0,
            intact,
            self.connects - before,
        )

    def close(self) -> None:
        self._post.close()
        self._stream.close()


def engine_single_stream(
    model: models.PreparedModel, pieces: list[str], params: RunParams, runs: int
) -> dict[str, Any]:
    """generate_tokens at each compute type and thread count; the best and the worker's own."""
    cores = available_cores()
    served = resolve_compute_type(model.path, params.compute_type)
    # A model that names its compute type (the demo: int8 breaks it) is measured at that type.
    types = ("int8", "float32") if served == "auto" else (served,)
    configs = {(served, params.intra_threads)}
    for compute_type in types:
        for intra in sorted({1, cores}):
            configs.add((compute_type, intra))
    results = []
    for compute_type, intra in sorted(configs):
        variant = RunParams(
            max_tokens=params.max_tokens,
            top_k=1,
            compute_type=compute_type,
            inter_threads=1,
            intra_threads=intra,
        )
        generator = load_generator(model, variant)
        try:
            stream_once(generator, pieces, variant)
            ttfts, rates = [], []
            for _ in range(runs):
                ttft, span, count = stream_once(generator, pieces, variant)
                ttfts.append(ttft)
                rates.append((count - 1) / span)
        finally:
            generator.unload_model()
            del generator
        row: dict[str, Any] = {
            "compute_type": compute_type,
            "intra_threads": intra,
            "ttft_ms": (percentile(ttfts, 50) or 0) * 1000,
            "tokens_per_s": percentile(rates, 50) or 0,
        }
        progress(f"engine {compute_type} intra={intra}: {row}")
        results.append(row)
    best = max(results, key=lambda r: r["tokens_per_s"])
    own = next(
        r
        for r in results
        if r["compute_type"] == served and r["intra_threads"] == params.intra_threads
    )
    return {"variants": results, "best": best, "worker_config": own}


def hop_budget(spans: list[ReceivedSpan], job_ids: set[str]) -> dict[str, Any]:
    """Per hop, p50/p99 ms over the measured jobs' traces (plus the transit to the reader)."""
    traces = {
        s.trace_id
        for s in spans
        if s.name == "llm_request" and s.attributes.get("gen_ai.request.id") in job_ids
    }
    by_trace: dict[str, dict[str, ReceivedSpan]] = {t: {} for t in traces}
    for span in spans:
        if span.trace_id in by_trace:
            by_trace[span.trace_id][span.name] = span
    durations: dict[str, list[float]] = {hop: [] for hop in (*HOPS, "transit", "worker decode")}
    for named in by_trace.values():
        for hop in HOPS:
            if hop in named:
                durations[hop].append(named[hop].seconds * 1000)
        if "first publish" in named and "first delivery" in named:
            gap = named["first delivery"].start_ns - named["first publish"].end_ns
            durations["transit"].append(gap / 1e6)
        request = named.get("llm_request")
        if request is not None:
            decode = request.attributes.get("gen_ai.latency.time_in_model_decode")
            tokens = request.attributes.get("gen_ai.usage.completion_tokens", 0)
            if decode:
                durations["worker decode"].append((tokens - 1) / decode)
    out: dict[str, Any] = {
        hop: summary(values) for hop, values in durations.items() if hop != "worker decode"
    }
    out["worker_tokens_per_s"] = summary(durations["worker decode"])
    out["traces"] = len(by_trace)
    return out


def bench_model(
    key: str, runs: int, max_tokens: int, out_dir: Path, traced: bool = True
) -> dict[str, Any]:
    model = models.prepare(key)
    pieces = models.prompt_pieces(model)
    params = RunParams(max_tokens=max_tokens, top_k=1)
    progress(f"=== {key}: engine alone")
    engine = engine_single_stream(model, pieces, params, min(runs, ENGINE_RUNS))
    sink = SpanSink()
    stack = Stack(out_dir / f"work-budget-{key}", model, params, max_tokens)
    if traced:
        stack.extra_env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
    try:
        stack.start()
        stack.start_worker(key)
        client = KeepAliveClient(stack.web_port)
        body = params.job_body(key, models.PROMPT) | {"ignore_eos": True}
        for _ in range(3):
            client.run(body)  # warm-up: pools, subscriptions, first calls
        progress(f"=== {key}: {runs} streams, one at a time")
        measured = [client.run(body) for _ in range(runs)]
        stop_ids = stop_string_jobs(client, body, runs)
        client.close()
        ids = {run.job_id for run in measured}
        spans = (
            []
            if not traced
            else sink.wait_for(
                lambda got: (
                    sum(1 for s in got if s.name == "first delivery") >= len(ids)
                    and sum(
                        1
                        for s in got
                        if s.name == "llm_request" and s.attributes.get("gen_ai.request.id") in ids
                    )
                    >= len(ids)
                ),
                timeout=30,
            )
        )
    finally:
        stack.close()
        sink.close()
    after_end = tokens_after_end(stack.log_dir / f"worker-{key}.log", stop_ids)
    return {
        "model": key,
        "parameters": model.parameters,
        "engine": engine,
        "post_ms": summary([r.post_s * 1000 for r in measured]),
        "ttft_ms": summary([r.ttft_s * 1000 for r in measured]),
        "tokens_per_s": summary([r.tokens_per_s for r in measured]),
        "intact": sum(r.intact for r in measured),
        "runs": len(measured),
        "reconnects": sum(r.new_connections for r in measured),
        "hops": hop_budget(spans, ids),
        "stop_tokens_after_end": summary(after_end),
    }


def stop_string_jobs(client: KeepAliveClient, body: dict[str, Any], runs: int) -> set[str]:
    """Greedy jobs that end on a stop string found mid-way through the greedy output."""
    probe = client.run(body)
    conn = http.client.HTTPConnection(HOST, client.port, timeout=60)
    conn.request("GET", f"/v1/jobs/{probe.job_id}")
    text = json.loads(conn.getresponse().read())["output"]
    conn.close()
    middle = len(text) // 2
    stop = text[middle : middle + 6]
    return {client.run(body | {"stop": [stop]}).job_id for _ in range(runs)}


def tokens_after_end(log_path: Path, job_ids: set[str]) -> list[float]:
    """From the worker's job log: tokens the engine made after each stop-string job ended."""
    found = []
    for line in log_path.read_text().splitlines():
        start = line.find('{"event": "finished"')
        if start < 0:
            continue
        record = json.loads(line[start:])
        if record["job_id"] in job_ids and record.get("finish_reason") == "stop":
            found.append(float(record.get("tokens_after_end", 0)))
    return found


def table(result: dict[str, Any]) -> str:
    engine = result["engine"]
    best, own = engine["best"], engine["worker_config"]
    hops = result["hops"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    submit_to_claim = [
        (hops["queue wait"][q] or 0) + (hops["claim"][q] or 0) for q in ("p50", "p99")
    ]
    lines = [
        f"### {result['model']} ({result['parameters'] / 1e6:.1f}M parameters)",
        "",
        "| figure | p50 | p99 |",
        "|---|---|---|",
        f"| engine alone, best ({best['compute_type']}, intra {best['intra_threads']}): "
        f"TTFT ms / tokens/s | {best['ttft_ms']:.2f} / {best['tokens_per_s']:.0f} | |",
        f"| engine at the worker's config ({own['compute_type']}, intra "
        f"{own['intra_threads']}): tokens/s | {own['tokens_per_s']:.0f} | |",
        f"| client TTFT, ms | {ms(result['ttft_ms']['p50'])} | {ms(result['ttft_ms']['p99'])} |",
        f"| added TTFT (client - engine), ms | {ms(result['ttft_ms']['p50'] - best['ttft_ms'])}"
        f" | {ms(result['ttft_ms']['p99'] - best['ttft_ms'])} |",
        f"| served tokens/s (ratio to best engine) | {result['tokens_per_s']['p50']:.0f} "
        f"({result['tokens_per_s']['p50'] / best['tokens_per_s']:.2f}) | |",
        f"| worker's own tokens/s (ratio to engine at its config) | "
        f"{hops['worker_tokens_per_s']['p50'] or 0:.0f} "
        f"({(hops['worker_tokens_per_s']['p50'] or 0) / own['tokens_per_s']:.2f}) | |",
        f"| POST /v1/jobs answered, ms | {ms(result['post_ms']['p50'])} "
        f"| {ms(result['post_ms']['p99'])} |",
        f"| submission -> claimed, ms | {ms(submit_to_claim[0])} | {ms(submit_to_claim[1])} |",
    ]
    for hop in (*HOPS[:7], "transit", "first delivery"):
        lines.append(f"| hop: {hop}, ms | {ms(hops[hop]['p50'])} | {ms(hops[hop]['p99'])} |")
    after = result["stop_tokens_after_end"]
    lines.append(
        f"| stop string: tokens the engine made past the end ({after['n']} jobs) "
        f"| {ms(after['p50'])} | {ms(after['p99'])} |"
    )
    lines.append(
        f"\n{result['runs']} streams of {result['tokens_per_s']['n']} measured, "
        f"{result['intact']} intact, {result['reconnects']} reconnects, "
        f"{hops['traces']} traces."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budget", description=__doc__)
    parser.add_argument("--model", default="demo,bench")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    parser.add_argument(
        "--no-trace", action="store_true", help="no OpenTelemetry (no hop budget; a baseline)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = [
        bench_model(key.strip(), args.runs, args.max_tokens, args.out, not args.no_trace)
        for key in args.model.split(",")
    ]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"budget-{stamp}.json").write_text(json.dumps(results, indent=2))
    print("\n\n".join(table(result) for result in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
