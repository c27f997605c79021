"""GET /metrics: the whole deployment in Prometheus text format, written by prometheus_client.

Workers add their counters and histograms to Redis (``trickle.telemetry.metrics``), because
prometheus_client's multiprocess mode only covers one host. A custom collector reads those totals
plus live gauges (queue depth over every priority, oldest queued job, live workers and their
slots, running jobs) and this process's open streams, and prometheus_client writes the text, label
escaping included. Any web process can serve it; ``trickle_active_streams`` is per web process.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from trickle import keys
from trickle.capacity import read_load
from trickle.telemetry.metric_defs import COUNTERS, HISTOGRAMS, Histogram
from trickle.telemetry.metrics import parse_labels
from web.admission.auth import operator_route
from web.services import Services, services

blueprint = Blueprint("metrics", __name__)


@blueprint.get("/metrics")
@operator_route
def metrics() -> Response:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeploymentCollector(services()))
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


class DeploymentCollector:
    """Collects on every scrape; holds nothing between them."""

    def __init__(self, svc: Services):
        self.svc = svc

    def collect(self) -> Iterator[Metric]:
        yield from self.gauges()
        yield from self.counters()
        for histogram in HISTOGRAMS:
            yield histogram_family(histogram, self._hash(keys.metric_histogram(histogram.name)))

    def gauges(self) -> Iterator[Metric]:
        svc = self.svc
        ttl = svc.settings.worker.heartbeat_ttl_seconds
        now = time.time()
        loads = [read_load(svc.redis, model, ttl, now, svc.queues) for model in svc.settings.models]
        depth = GaugeMetricFamily(
            "trickle_queue_depth",
            "Jobs waiting in each model's queue (every priority).",
            labels=["model"],
        )
        oldest = GaugeMetricFamily(
            "trickle_oldest_queued_seconds",
            "Age of the oldest job waiting in each model's queue.",
            labels=["model"],
        )
        workers = GaugeMetricFamily(
            "trickle_workers",
            "Live workers (recent heartbeat) serving each model.",
            labels=["model"],
        )
        slots = GaugeMetricFamily(
            "trickle_worker_slots",
            "Task slots of live workers per model, busy or idle.",
            labels=["model", "state"],
        )
        for load in loads:
            depth.add_metric([load.model], load.depth)
            oldest.add_metric([load.model], load.oldest_queued_seconds)
            workers.add_metric([load.model], len(load.workers))
            slots.add_metric([load.model, "busy"], load.busy)
            slots.add_metric([load.model, "idle"], load.total - load.busy)
        yield from (depth, oldest, workers, slots)
        yield GaugeMetricFamily(
            "trickle_running_jobs",
            "Jobs held by a worker right now.",
            value=svc.store.running_count(),
        )
        yield GaugeMetricFamily(
            "trickle_active_streams",
            "Open SSE/WebSocket/OpenAI streams in this web process.",
            value=svc.hub.active_subscriptions,
        )

    def counters(self) -> Iterator[Metric]:
        stored = self._hash(keys.METRIC_COUNTERS)
        for counter in COUNTERS:
            family = Metric(counter.name.removesuffix("_total"), counter.help, "counter")
            for field, value in sorted(stored.items()):
                name, _, encoded = field.partition("|")
                labels = parse_labels(encoded)
                if name == counter.name and labels is not None:
                    family.add_sample(counter.name, labels, float(value))
            yield family

    def _hash(self, key: str) -> dict[str, str]:
        return {str(field): str(value) for field, value in self.svc.redis.hgetall(key).items()}


def histogram_family(histogram: Histogram, stored: dict[str, str]) -> Metric:
    """Cumulative buckets per label set, from the per-bucket counts workers recorded."""
    by_labels: dict[str, dict[str, float]] = defaultdict(dict)
    for field, value in stored.items():
        encoded, _, part = field.rpartition("|")
        by_labels[encoded][part] = float(value)
    family = Metric(histogram.name, histogram.help, "histogram")
    for encoded, parts in sorted(by_labels.items()):
        labels = parse_labels(encoded)
        if labels is None:
            continue
        running = 0.0
        for bound in [*histogram.buckets, float("inf")]:
            running += parts.get("+Inf" if bound == float("inf") else repr(float(bound)), 0.0)
            le = "+Inf" if bound == float("inf") else _bound(bound)
            family.add_sample(f"{histogram.name}_bucket", {**labels, "le": le}, running)
        family.add_sample(f"{histogram.name}_sum", labels, parts.get("sum", 0.0))
        family.add_sample(f"{histogram.name}_count", labels, parts.get("count", 0.0))
    return family


def _bound(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))
