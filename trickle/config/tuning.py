"""The tuning knobs: timings and lane counts that trade latency against CPU on one machine.

They are kept apart from the product keys (``trickle.config.sections``) because they change
no behaviour a client can rely on: a job gets the same tokens, limits and guarantees whatever
they are set to, only sooner or later, at more or less CPU. Their defaults suit a small CPU
host; ``docs/performance.md`` has the measurements behind them and how to repeat those on
another machine. ``[tuning]`` holds the process-wide ones, ``[models.<name>.tuning]`` each
model's engine ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import NonNegativeFloat, NonNegativeInt

from trickle.config.base import Section


@dataclass(frozen=True)
class TuningSettings(Section):
    """``[tuning]``: how the worker paces tokens and threads, and how the web tier writes."""

    # Token flushes to Redis (one script, one PUBLISH per job) at most this often after a job's
    # first tokens: every later cost is per message, so each should carry several decoding
    # steps. 0 flushes every step. A first token and an end go at once.
    publish_interval_ms: NonNegativeFloat = 20.0
    # With many jobs the interval grows to keep messages (one per job per flush) under this
    # rate, up to publish_max_interval_ms: each message costs the worker, Redis, the web tier
    # and the client CPU that the engine needs under load. 0 keeps publish_interval_ms.
    publish_max_messages_per_second: NonNegativeFloat = 1000.0
    # At 1,000 messages/s the interval passes 30 ms only past 30 jobs in flight (and reaches
    # this at 150), where the cores are full: at 1.0x on the demo (five lanes of 32) 150 ms
    # served 11-21 % more tokens/s than 30 ms, the serving path's CPU a token down a quarter,
    # ITL p99 no worse, and 0.15x and 0.3x were better too (docs/performance.md).
    publish_max_interval_ms: NonNegativeFloat = 150.0
    # Python's GIL switch interval in the worker process. Its I/O threads (Celery's consumer,
    # the task threads that claim jobs, the publisher) each wait up to this long for the GIL
    # while the engine thread turns decoding steps into tokens, so a long interval delays
    # claims under a burst. 0 keeps Python's default.
    gil_switch_interval_ms: NonNegativeFloat = 0.5
    # With two API keys or more: how far a key's service on a worker (its tokens, weighted: a
    # prompt token 1, an output token 2, over the key's weight) may run ahead of the
    # least-served other key at work there before the key's next job waits for it
    # (worker/fairness/vtc.py): keys share in tokens, not in jobs. About two long jobs' cost;
    # 0: keys only take turns by jobs.
    share_lag_tokens: NonNegativeFloat = 4096.0
    # A stream writes at most once per this interval after the first token (tokens that arrive
    # meanwhile go out together). 0: as messages arrive, since the publisher already paces each
    # job's messages; the pace still grows with a process's streams
    # (web.streams.routes.stream_pace).
    stream_flush_interval_ms: NonNegativeFloat = 0.0


@dataclass(frozen=True)
class ModelTuning(Section):
    """``[models.<name>.tuning]``: how the engine batches, restarts and splits this model's jobs."""

    # A new batch waits this long for company before it starts: a longer window batches more
    # jobs per step at the cost of every lone job's first token.
    max_batch_wait_ms: NonNegativeFloat = 2.0
    # A job arriving more than this long after the one before starts at once instead of waiting
    # max_batch_wait_ms for company (a burst that follows joins it by a restart); 0 = always
    # wait the window. Too long a quiet spell makes a client sending one job after another
    # wait the window on every job.
    quiet_start_after_ms: NonNegativeFloat = 5.0
    # The engine process runs this much "nicer" than the serving processes on a CPU (on a GPU
    # the engine waits on the device anyway): when cores are short, POSTs, claims and token
    # writes go first and CTranslate2 takes what is left. 0 = the same priority.
    engine_niceness: int = 5
    # The engine process keeps memory it frees for its next steps instead of mapping fresh
    # pages each step (glibc; worker/engine/malloc.py): its resident memory stays at its peak.
    engine_keep_freed_memory: bool = True
    # ...until no batch has run for this long: then the free heap goes back to the OS
    # (``malloc_trim``), so the engine's memory returns to about its idle size after a flood.
    # 0 = never (the peak stays).
    engine_trim_after_idle_seconds: NonNegativeFloat = 5.0
    # Decoding steps faster than this go from the engine process to the worker together, one
    # pipe message per this long (a sequence's first tokens and its end go at once): receiving
    # a message costs the worker more CPU than the few tokens in it. 0 = one message per step.
    engine_step_coalesce_ms: NonNegativeFloat = 2.0
    # A job arriving while every lane is busy restarts a young batch to join it, if the running
    # sequences' catch-up pause stays under this (worker/engine/policy.py): below a 50 ms
    # inter-token SLO, so a restart never shows as a stall. 0 = never restart.
    rebatch_max_stall_ms: NonNegativeFloat = 40.0
    # Past that pause, a restart is still made when the newcomers would otherwise wait at least
    # this many times the pause for a lane to free up (the running batch's remaining steps);
    # 0 = never past rebatch_max_stall_ms.
    rebatch_wait_ratio: NonNegativeFloat = 4.0
    # A lane idle while another runs several sequences takes half of them (a restart of that
    # batch as two) when the time saved is at least this many times the catch-up it costs
    # (worker/engine/policy.py); 0 = never split a running batch.
    rebalance_gain_ratio: NonNegativeFloat = 3.0
    # With two API keys or more (named or api_keys): one engine lane more per device, and one
    # batch more in the prefetch window, for keys below their share of the slots while a flood
    # holds every other lane (worker/engine/fair_share.py). It shares the cores while it runs.
    reserve_lane: bool = True
    # Without the tenants' reserve lane: engine lanes beyond inter_threads per device for a job
    # that no running batch can take without pausing its streams past rebatch_max_stall_ms and
    # that would otherwise wait for a batch to end (worker/engine/rebalance.py), while one more
    # lane stretches the running steps by at most that budget. They are never given a split's
    # half, so one is free for the next such job; on a CPU they share the cores while they run.
    # More than one, because arrivals come in clumps (docs/performance.md). 0 = none.
    overflow_lanes_per_device: NonNegativeInt = 3
