"""A worker's models: an engine and a batch scheduler per served model, loaded once.

Apart from ``worker.runtime``, which runs jobs on what this loads: loading is done once per
process, before the first job, and what it needs (the settings, where each step's tokens go,
the metrics its schedulers feed, the cold-start clock its load times go to) is all it touches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from trickle.config.settings import Settings
from trickle.telemetry.metric_defs import BATCH_SIZE, ENGINE_RESTARTS
from trickle.telemetry.metrics import MetricsRecorder
from worker.coldstart import ColdStart
from worker.engine.batch import StepSink
from worker.engine.engine import Engine
from worker.engine.scheduler import BatchScheduler
from worker.engine.scheduler_setup import scheduler_for

log = logging.getLogger(__name__)


def load_models(
    settings: Settings, publish_step: StepSink, metrics: MetricsRecorder, cold_start: ColdStart
) -> tuple[dict[str, Engine], dict[str, BatchScheduler]]:
    """An engine and its scheduler per served model, each load timed for the cold start."""
    engines: dict[str, Engine] = {}
    schedulers: dict[str, BatchScheduler] = {}
    for name in settings.served_models():
        model = settings.model(name)
        loading = time.monotonic()
        engine = Engine(model, shares_slots=settings.shares_slots)
        cold_start.loaded(time.monotonic() - loading)
        engines[name] = engine
        schedulers[name] = scheduler_for(
            engine,
            publish_step,
            on_batch=batch_observer(metrics, name),
            on_restart=restart_observer(metrics, name),
        )
        log.info("model %s loaded from %s on %s", name, model.path, engine.device)
    return engines, schedulers


def batch_observer(metrics: MetricsRecorder, model: str) -> Callable[[int], None]:
    def observe(size: int) -> None:
        metrics.observe(BATCH_SIZE, size, model=model)

    return observe


def restart_observer(metrics: MetricsRecorder, model: str) -> Callable[[bool], None]:
    def observe(split: bool) -> None:
        metrics.count(ENGINE_RESTARTS, model=model, kind="split" if split else "join")

    return observe
