"""The scheduler a worker runs for one model: its configured knobs, read once from the model's
settings (``bench.scheduler_burst`` and ``bench.admission`` measure the same one without the
rest of the worker)."""

from __future__ import annotations

from collections.abc import Callable

from worker.engine.batch import StepSink
from worker.engine.engine import Engine
from worker.engine.prefix import PrefixTable
from worker.engine.scheduler import BatchScheduler


def scheduler_for(
    engine: Engine,
    publish_step: StepSink,
    on_batch: Callable[[int], None] | None = None,
    on_restart: Callable[[bool], None] | None = None,
) -> BatchScheduler:
    """The scheduler for ``engine``'s model with its configured knobs."""
    model = engine.settings
    return BatchScheduler(
        engine,
        publish_step,
        max_batch_size=model.max_batch_size,
        max_batch_wait_ms=model.tuning.max_batch_wait_ms,
        engine_threads=model.lanes,
        on_batch=on_batch,
        rebatch_max_stall_ms=model.tuning.rebatch_max_stall_ms,
        rebatch_wait_ratio=model.tuning.rebatch_wait_ratio,
        quiet_start_after_ms=model.tuning.quiet_start_after_ms,
        rebalance_gain_ratio=model.tuning.rebalance_gain_ratio,
        prefixes=PrefixTable.for_model(model, engine.tokenizer),
        on_restart=on_restart,
        spare_lanes=engine.lanes.spare,
        spare_use=engine.lanes.spare_use,
    )
