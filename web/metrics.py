"""GET /metrics: Prometheus text format for the whole deployment.

Workers add their counters and histograms to Redis (``worker.metrics``); this view reads those
totals plus live gauges (queue depth over every priority, oldest queued job, live workers
and their slots, running jobs) and this process's open
streams. Any web process can serve it; `trickle_active_streams` is per web process.
"""

from __future__ import annotations

import time
from collections import defaultdict

from flask import Blueprint, Response

from web.services import Services, services
from worker import keys
from worker.capacity import read_load
from worker.metric_defs import COUNTERS, HISTOGRAMS, Histogram

blueprint = Blueprint("metrics", __name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@blueprint.get("/metrics")
def metrics() -> Response:
    svc = services()
    lines = gauges(svc) + counters(svc)
    for histogram in HISTOGRAMS:
        stored = _read_hash(svc, keys.metric_histogram(histogram.name))
        lines += histogram_lines(histogram, stored)
    return Response("\n".join(lines) + "\n", content_type=CONTENT_TYPE)


def gauges(svc: Services) -> list[str]:
    now = time.time()
    ttl = svc.settings.worker.heartbeat_ttl_seconds
    loads = [read_load(svc.redis, model, ttl, now, svc.queues) for model in svc.settings.models]
    lines = [
        "# HELP trickle_queue_depth Jobs waiting in each model's queue (every priority).",
        "# TYPE trickle_queue_depth gauge",
    ]
    lines += [f'trickle_queue_depth{{model="{x.model}"}} {x.depth}' for x in loads]
    lines += [
        "# HELP trickle_oldest_queued_seconds Age of the oldest job waiting in each model's queue.",
        "# TYPE trickle_oldest_queued_seconds gauge",
    ]
    lines += [
        f'trickle_oldest_queued_seconds{{model="{x.model}"}} {_number(x.oldest_queued_seconds)}'
        for x in loads
    ]
    lines += [
        "# HELP trickle_workers Live workers (recent heartbeat) serving each model.",
        "# TYPE trickle_workers gauge",
    ]
    lines += [f'trickle_workers{{model="{x.model}"}} {len(x.workers)}' for x in loads]
    lines += [
        "# HELP trickle_worker_slots Task slots of live workers per model, busy or idle.",
        "# TYPE trickle_worker_slots gauge",
    ]
    for x in loads:
        lines.append(f'trickle_worker_slots{{model="{x.model}",state="busy"}} {x.busy}')
        lines.append(f'trickle_worker_slots{{model="{x.model}",state="idle"}} {x.total - x.busy}')
    lines += [
        "# HELP trickle_running_jobs Jobs held by a worker right now.",
        "# TYPE trickle_running_jobs gauge",
        f"trickle_running_jobs {svc.redis.zcard(keys.RUNNING_JOBS)}",
        "# HELP trickle_active_streams Open SSE/WebSocket/OpenAI streams in this web process.",
        "# TYPE trickle_active_streams gauge",
        f"trickle_active_streams {svc.hub.active_subscriptions}",
    ]
    return lines


def counters(svc: Services) -> list[str]:
    stored = _read_hash(svc, keys.METRIC_COUNTERS)
    lines = []
    for counter in COUNTERS:
        lines += [f"# HELP {counter.name} {counter.help}", f"# TYPE {counter.name} counter"]
        for field, value in sorted(stored.items()):
            name, _, labels = field.partition("|")
            if name == counter.name:
                lines.append(f"{name}{{{labels}}} {_number(value)}")
    return lines


def histogram_lines(histogram: Histogram, stored: dict[str, str]) -> list[str]:
    """Cumulative buckets per label set, from the per-bucket counts workers recorded."""
    by_labels: dict[str, dict[str, float]] = defaultdict(dict)
    for field, value in stored.items():
        labels, _, part = field.rpartition("|")
        by_labels[labels][part] = float(value)
    name = histogram.name
    lines = [f"# HELP {name} {histogram.help}", f"# TYPE {name} histogram"]
    for labels, parts in sorted(by_labels.items()):
        running = 0.0
        for bound in [repr(float(b)) for b in histogram.buckets] + ["+Inf"]:
            running += parts.get(bound, 0.0)
            le = bound if bound == "+Inf" else _number(bound)
            separator = "," if labels else ""
            lines.append(f'{name}_bucket{{{labels}{separator}le="{le}"}} {_number(running)}')
        lines.append(f"{name}_sum{{{labels}}} {_number(parts.get('sum', 0.0))}")
        lines.append(f"{name}_count{{{labels}}} {_number(parts.get('count', 0.0))}")
    return lines


def _read_hash(svc: Services, key: str) -> dict[str, str]:
    return {str(field): str(value) for field, value in svc.redis.hgetall(key).items()}


def _number(value: str | float) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)
