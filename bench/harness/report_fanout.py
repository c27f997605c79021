"""The fan-out section of the bench report: one gunicorn (gevent) process streaming to many
readers, with its memory, Redis connections, health probes and CPU per reader count."""

from __future__ import annotations

from typing import Any

from bench.harness.md_table import fmt, stat, table


def fanout_markdown(runs: list[dict[str, Any]]) -> list[str]:
    if not runs:
        return []
    rows = []
    for run in runs:
        if run.get("error"):
            rows.append([str(run.get("readers")), f"error: {run['error']}"] + ["-"] * 13)
            continue
        m = run["readers"]
        connect = run.get("connect") or {}
        window = run.get("window") or {}
        base = run.get("rss_baseline_kib")
        idle = run.get("rss_idle_kib")
        busy = run.get("rss_streaming_kib")
        clients = run.get("redis_clients_baseline")
        notes = []
        if window.get("ended_early"):
            notes.append("jobs ended in window")
        if window.get("closed_early"):
            notes.append(f"{window['closed_early']} streams cut")
        web_log = run.get("web_log") or {}
        for key in ("subscription_lost", "tracebacks", "http_5xx"):
            if web_log.get(key):
                notes.append(f"{key} x{web_log[key]}")
        for state in ("idle", "streaming"):
            probes = run.get(f"healthz_{state}") or {}
            answered = (probes.get("ms") or {}).get("n", 0)
            if probes.get("failures") or answered < probes.get("requested", 0):
                notes.append(
                    f"/healthz {state}: {probes.get('failures', 0)} timed out, "
                    f"{answered}/{probes.get('requested')} answered"
                )
        states = {s.get("status") for s in run.get("job_states") or []}
        if "failed" in states:
            notes.append("jobs failed")
        rows.append(
            [
                str(m),
                f"{connect.get('connected', 0)} in {fmt(connect.get('seconds'), 1)}s",
                f"{window.get('jobs_streaming', '-')}/{run.get('jobs')}",
                fmt(window.get("generated_tokens_per_s")),
                fmt(window.get("demand_tokens_per_s")),
                fmt(window.get("delivered_tokens_per_s")),
                fmt(window.get("backlog_tokens_at_end")),
                fmt((window.get("redis_commands") or {}).get("lrange")),
                f"{fmt(_mib(base), 0)} / {fmt(_mib(idle), 0)} / {fmt(_mib(busy), 0)}",
                f"{fmt(_per(idle, base, m), 1)} / {fmt(_per(busy, base, m), 1)}",
                f"+{_delta(run.get('redis_clients_idle'), clients)} / "
                f"+{_delta(run.get('redis_clients_streaming'), clients)}",
                f"{fmt(run.get('web_redis_connections_baseline'))} / "
                f"{fmt(run.get('web_redis_connections_idle'))} / "
                f"{fmt(run.get('web_redis_connections_streaming'))}",
                f"{fmt(stat(run.get('healthz_idle'), 'ms', 'p50'), 1)} / "
                f"{fmt(stat(run.get('healthz_idle'), 'ms', 'p99'), 1)}",
                f"{fmt(stat(run.get('healthz_streaming'), 'ms', 'p50'), 1)} / "
                f"{fmt(stat(run.get('healthz_streaming'), 'ms', 'p99'), 1)}",
                _fanout_cpu(window.get("cpu_percent") or {}),
                "; ".join(notes) or "",
            ]
        )
    header = [
        "readers M",
        "connected",
        "jobs streaming",
        "generated tok/s",
        "demand tok/s",
        "delivered tok/s",
        "backlog (tokens)",
        "log re-reads (LRANGE)",
        "RSS MiB before / idle / busy",
        "KiB per stream idle / busy",
        "Redis clients +idle / +busy",
        "web's Redis conns before / idle / busy",
        "/healthz p50/p99 ms idle",
        "/healthz p50/p99 ms busy",
        "CPU % web / readers / worker / redis",
        "notes",
    ]
    jobs = runs[0].get("jobs")
    return [
        f"### Fan-out: one gunicorn (gevent) process, {jobs} running jobs",
        "",
        *table(header, rows),
        "",
    ]


def _fanout_cpu(cpu: dict[str, float]) -> str:
    worker = sum(v for k, v in cpu.items() if k.startswith("worker:"))
    parts = [cpu.get("web"), cpu.get("readers"), worker if cpu else None, cpu.get("redis")]
    return " / ".join(fmt(p) for p in parts)


def _mib(kib: int | None) -> float | None:
    return None if kib is None else kib / 1024


def _per(value: int | None, base: int | None, m: int) -> float | None:
    return None if value is None or base is None or not m else (value - base) / m


def _delta(value: int | None, base: int | None) -> str:
    return "-" if value is None or base is None else str(value - base)
