"""The markdown table (stdout, ``latest.md``) and the JSON file of one run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.harness.md_table import fmt, stat, table
from bench.harness.report_fanout import fanout_markdown
from bench.harness.stats import difference, ratio

NOTES = """\
What each figure includes:
- Engine: CTranslate2 in the benchmark process, no Trickle; same model directory, device,
  compute type and thread knobs as the worker; sampling as Trickle asks for it (temperature, top_k,
  top_p, `return_scores`, prompt excluded, `end_token=[]`). generate_tokens TTFT: call -> first
  token; tokens/s: first -> last token. generate_batch: N copies of the prompt, N x max_tokens /
  wall; "+ callback" adds a no-op Python step callback (Trickle always has one).
- Trickle: embedded Redis + one Celery worker + one gunicorn (gevent) worker, all on this machine,
  clients in the benchmark process (asyncio, raw sockets). TTFT: client clock, just before POST
  /v1/jobs -> first `token` SSE event (POST, queueing, Celery, batching wait, prompt, first step,
  Redis publish, web hub, SSE). Server TTFT: the job's own `time_to_first_token_seconds` (job
  created -> first token, worker clock). Stream tokens/s: first -> last token event; end-to-end:
  tokens / (before POST -> `done`); worker: the job's first token -> completed, worker clock
  (no SSE, no client). Aggregate: all tokens / (first POST -> last `done`).
  Batches are inferred from the jobs' first-token times.
- Added TTFT = Trickle single-stream TTFT - engine generate_tokens TTFT, at the same percentile.
  Paired: each Trickle stream right after one generate_tokens stream, the stack up, the Trickle
  streams on one keep-alive connection (bench/paired.py); the median of the pairs' TTFT
  differences and tokens/s ratios (the machine drifts between the engine phase and the stack's).
  Unpaired single streams open a connection per request (POST with `Connection: close`).
- Redis: messages counted by a subscriber on the jobs' token channels; commands from INFO
  commandstats (all clients: worker, web, Celery, the bench itself). Steps = batches x max_tokens.
- Fan-out: readers connect while the jobs wait in the queue (no worker yet), so each reader gets
  every token live. Jobs streaming: jobs that generated tokens during the window. Demand = tokens
  generated x readers per job; delivered = tokens received by all readers, same window; backlog
  = tokens owed to readers but not yet received at the window's end. LRANGE: replay-log reads
  in the window (readers resynchronising; 0 while live delivery keeps up). RSS: VmRSS of the
  gunicorn worker; per stream = (RSS with M streams - RSS before) / M, "busy" while the jobs
  stream. Redis clients: CLIENT LIST count minus the count before the readers connected ("busy"
  includes the worker, started after); web's Redis conns: the gunicorn worker's own established
  connections to Redis (/proc). /healthz: sequential GETs on fresh connections from the
  benchmark process (5 s timeout, 30 s budget).
- Client, server, worker and Redis share the machine's CPUs: every figure includes that
  competition."""


def model_markdown(result: dict[str, Any]) -> list[str]:
    model = result["model"]
    params = result["params"]
    lines = [
        f"## {model['key']}: {model['description']}",
        "",
        f"{model['parameters'] / 1e6:.1f}M parameters, `{model['path']}`. Prompt "
        f"{result['prompt']!r} ({result['prompt_tokens']} tokens with BOS), "
        f"{params['max_tokens']} new tokens per request, temperature {params['temperature']}, "
        f"top_k {params['top_k']}, ignore_eos; device {result['device']}, compute_type "
        f"{params['compute_type']}, inter_threads {params['inter_threads']}, intra_threads "
        f"{params['intra_threads']}; Trickle batched: max_batch_size {params['max_batch_size']}, "
        f"max_batch_wait_ms {params['max_batch_wait_ms']}.",
        "",
    ]
    engine = result.get("engine") or {}
    trickle = result.get("trickle") or {}
    for name in ("engine", "trickle"):
        section = result.get(name) or {}
        if section.get("error"):
            lines += [f"**{name} failed:** `{section['error']}`", ""]
    lines += _throughput(engine, trickle)
    lines += _latency(engine, trickle)
    lines += _cpu(trickle)
    lines += _failures(trickle)
    lines += _roundtrips(trickle.get("roundtrips"))
    lines += fanout_markdown(trickle.get("fanout") or [])
    return lines


def _throughput(engine: dict[str, Any], trickle: dict[str, Any]) -> list[str]:
    stream = engine.get("generate_tokens")
    single = trickle.get("single_stream")
    rows = [
        [
            "1 stream (generate_tokens / SSE)",
            fmt(stat(stream, "tokens_per_s", "p50")),
            "-",
            fmt(stat(single, "tokens_per_s", "p50")),
            fmt(ratio(stat(single, "tokens_per_s", "p50"), stat(stream, "tokens_per_s", "p50")), 2),
            "-",
            f"worker {fmt(stat(single, 'worker_tokens_per_s', 'p50'))}, "
            f"e2e {fmt(stat(single, 'end_to_end_tokens_per_s', 'p50'))}",
        ]
    ]
    pairs = trickle.get("paired")
    if pairs and "error" not in pairs:
        rows.append(
            [
                f"**1 stream, paired with the engine ({pairs.get('pairs', 0)} pairs)**",
                fmt(stat(pairs, "engine_tokens_per_s", "p50")),
                "-",
                fmt(stat(pairs, "trickle_tokens_per_s", "p50")),
                f"**{fmt(stat(pairs, 'tokens_per_s_ratio', 'p50'), 2)}**",
                "-",
                "median of the pairs' ratios",
            ]
        )
    by_n = {int(b["n"]): b for b in engine.get("generate_batch") or []}
    batched = {int(k): v for k, v in (trickle.get("batched") or {}).items()}
    unbatched = {int(k): v for k, v in (trickle.get("unbatched") or {}).items()}
    for n in sorted(set(by_n) | set(batched) | set(unbatched)):
        eng = by_n.get(n, {})
        tb = batched.get(n, {})
        tu = unbatched.get(n, {})
        rows.append(
            [
                f"N = {n}",
                fmt(eng.get("tokens_per_s")),
                fmt(eng.get("with_callback_tokens_per_s")),
                _aggregate(tb),
                fmt(ratio(tb.get("aggregate_tokens_per_s") or None, eng.get("tokens_per_s")), 2),
                _aggregate(tu),
                " ".join(str(s) for s in tb.get("batches_inferred") or []) or "-",
            ]
        )
    header = [
        "tokens/s (p50 / aggregate)",
        "engine",
        "engine + callback",
        "Trickle batched",
        "Trickle / engine",
        "Trickle max_batch_size=1",
        "batches seen (batched)",
    ]
    return ["### Throughput", "", *table(header, rows), ""]


def _aggregate(section: dict[str, Any]) -> str:
    """Aggregate tokens/s, or why there is none."""
    if section.get("error"):
        return "error"
    if section and section.get("failed") == section.get("clients"):
        return "all failed"
    text = fmt(section.get("aggregate_tokens_per_s"))
    return f"{text} ({section['failed']} failed)" if section.get("failed") else text


def _cpu(trickle: dict[str, Any]) -> list[str]:
    rows = []
    for label, key in (("batched", "batched"), ("max_batch_size=1", "unbatched")):
        for n, section in sorted((int(k), v) for k, v in (trickle.get(key) or {}).items()):
            cpu = section.get("cpu_percent") or {}
            if not cpu:
                continue
            worker = sum(v for k, v in cpu.items() if k.startswith("worker:"))
            rows.append(
                [
                    f"{n} concurrent, {label}",
                    fmt(worker),
                    fmt(cpu.get("web")),
                    fmt(cpu.get("redis")),
                    fmt(cpu.get("bench")),
                ]
            )
    if not rows:
        return []
    header = ["CPU % of one core during", "worker", "web", "redis", "clients (bench)"]
    return ["### CPU use (2 cores = 200 %)", "", *table(header, rows), ""]


def _latency(engine: dict[str, Any], trickle: dict[str, Any]) -> list[str]:
    stream = engine.get("generate_tokens")
    single = trickle.get("single_stream")
    added_ttft = [
        difference(stat(single, "ttft_ms", which), stat(stream, "ttft_ms", which))
        for which in ("p50", "p99")
    ]
    rows = [
        [
            f"engine generate_tokens TTFT ({(stream or {}).get('runs', 0)} runs)",
            fmt(stat(stream, "ttft_ms", "p50"), 2),
            fmt(stat(stream, "ttft_ms", "p99"), 2),
        ],
        [
            f"Trickle single stream TTFT, client ({(single or {}).get('runs', 0)} runs)",
            fmt(stat(single, "ttft_ms", "p50"), 2),
            fmt(stat(single, "ttft_ms", "p99"), 2),
        ],
        [
            "**added TTFT over direct**",
            *(f"**{fmt(added, 2)}**" for added in added_ttft),
        ],
        [
            "**added TTFT, paired with the engine (median of the pairs' differences)**",
            f"**{fmt(stat(trickle.get('paired'), 'added_ttft_ms', 'p50'), 2)}**",
            f"**{fmt(stat(trickle.get('paired'), 'added_ttft_ms', 'p99'), 2)}**",
        ],
        [
            "Trickle single stream TTFT, server (job created -> first token)",
            fmt(stat(single, "server_ttft_ms", "p50"), 2),
            fmt(stat(single, "server_ttft_ms", "p99"), 2),
        ],
    ]
    for label, key in (("batched", "batched"), ("max_batch_size=1", "unbatched")):
        for n, section in sorted((int(k), v) for k, v in (trickle.get(key) or {}).items()):
            rows.append(
                [
                    f"Trickle {n} concurrent, {label}, TTFT client",
                    fmt(stat(section, "ttft_ms", "p50"), 1),
                    fmt(stat(section, "ttft_ms", "p99"), 1),
                ]
            )
    return ["### Latency (ms)", "", *table(["", "p50", "p99"], rows), ""]


def _failures(trickle: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    sections: list[tuple[str, dict[str, Any]]] = []
    if trickle.get("single_stream"):
        sections.append(("single stream", trickle["single_stream"]))
    for key in ("batched", "unbatched"):
        for n, section in (trickle.get(key) or {}).items():
            sections.append((f"{key} N={n}", section))
    for label, section in sections:
        if section.get("failed"):
            total = section.get("runs") or section.get("clients")
            errors = "; ".join(section.get("errors") or [])
            lines.append(f"- **{label}: {section['failed']}/{total} failed**: `{errors}`")
        elif section.get("error"):
            lines.append(f"- **{label}: {section['error']}**")
    if trickle.get("error"):
        lines.append(f"- **Trickle phase error**: `{trickle['error']}`")
    return (["### Failures", "", *lines, ""]) if lines else []


def _roundtrips(rt: dict[str, Any] | None) -> list[str]:
    if not rt:
        return []
    header = [
        "jobs",
        "batches",
        "steps",
        "msgs on token channels",
        "msgs / step",
        "tokens / msg",
        "PUBLISH / step (all channels)",
        "EVALSHA / step (all clients)",
        "EXEC / step (all clients)",
        "Redis cmds / token (all)",
    ]
    row = [
        str(rt.get("jobs")),
        " ".join(str(s) for s in rt.get("batches_inferred") or []) or "-",
        str(rt.get("decoding_steps")),
        str(rt.get("channel_messages")),
        fmt(rt.get("messages_per_step"), 2),
        fmt(rt.get("tokens_per_message"), 1),
        fmt(rt.get("publish_per_step"), 2),
        fmt(rt.get("scripts_per_step"), 2),
        fmt(rt.get("exec_per_step"), 2),
        fmt(rt.get("commands_per_token"), 2),
    ]
    return ["### Redis per decoding step (one worker)", "", *table(header, [row]), ""]


def markdown(run: dict[str, Any]) -> str:
    machine = run["machine"]
    git = machine.get("git") or {}
    lines = [
        f"# Trickle bench, {run['started_at']}",
        "",
        f"Machine: {machine['nproc']} CPUs ({machine['cpu_model']}), "
        f"{machine['mem_total_gib']} GiB, Python {machine['python']}, CTranslate2 "
        f"{machine['ctranslate2']}, CUDA devices {machine['cuda_devices']}, load average at start "
        f"{' '.join(f'{x:.2f}' for x in machine['load_average_at_start'])}; git "
        f"{git.get('commit', '?')} ({len(git.get('modified') or [])} files modified or new). "
        f"Command: `{run['command']}` ({'quick' if run['quick'] else 'full'}, "
        f"{fmt(run.get('duration_s'), 0)} s).",
        "",
    ]
    for result in run["models"].values():
        lines += model_markdown(result)
    lines += [NOTES, ""]
    return "\n".join(lines)


def write(run: dict[str, Any], out_dir: Path, stamp: str) -> list[Path]:
    """One JSON file per model (``<model>-<stamp>.json``) and ``latest.md`` for the whole run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shared = {key: value for key, value in run.items() if key != "models"}
    paths = []
    for key, result in run["models"].items():
        path = out_dir / f"{key}-{stamp}.json"
        path.write_text(json.dumps({**shared, "model": result}, indent=2, default=str) + "\n")
        paths.append(path)
    md_path = out_dir / "latest.md"
    md_path.write_text(markdown(run))
    paths.append(md_path)
    return paths
