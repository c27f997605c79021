"""A single stream against CTranslate2 alone, back to back: the figures the goals are set in.

The engine's own limit is measured before the stack starts, and the single streams after it:
on this shared machine the speed drifts by half between the two (the engine alone read 1,635
to 3,830 tokens/s over one evening), so their ratio said more about the machine than about
Trickle. Here each Trickle stream follows one ``generate_tokens`` stream on the same model, in
this process, with the stack up and idle: each pair sees the same machine, and the medians of
the pairs' differences (TTFT) and ratios (tokens/s) are what is reported. The Trickle streams
share one keep-alive connection (``e2e.KeepAliveClient``), as a browser's or an SDK's requests
do: a connection per request added a TCP connect and ``Connection: close`` to every TTFT.
"""

from __future__ import annotations

from typing import Any

from bench import e2e, engine_limit
from bench.harness.log import progress
from bench.harness.models import PreparedModel
from bench.harness.params import RunParams
from bench.harness.stats import median, summary


def measure(
    model: PreparedModel,
    pieces: list[str],
    params: RunParams,
    host: str,
    port: int,
    body: dict[str, Any],
    runs: int,
) -> dict[str, Any]:
    generator = engine_limit.load_generator(model, params)
    client = e2e.KeepAliveClient(host, port)
    try:
        engine_limit.stream_once(generator, pieces, params)  # warm-up: first call allocates
        client.run(body)
        added_ms: list[float] = []
        ratios: list[float] = []
        engine_rates: list[float] = []
        trickle_rates: list[float] = []
        failed = 0
        for _ in range(runs):
            ttft, span, count = engine_limit.stream_once(generator, pieces, params)
            run = client.run(body)
            if not run.ok or run.ttft_s is None or run.tokens_per_s is None:
                failed += 1
                continue
            added_ms.append(1000 * (run.ttft_s - ttft))
            if count > 1 and span > 0:
                engine_rate = (count - 1) / span
                engine_rates.append(engine_rate)
                trickle_rates.append(run.tokens_per_s)
                ratios.append(run.tokens_per_s / engine_rate)
    finally:
        client.close()
        generator.unload_model()
        del generator
    out = {
        "pairs": runs,
        "failed": failed,
        "added_ttft_ms": summary(added_ms),
        "tokens_per_s_ratio": summary(ratios),
        "engine_tokens_per_s": summary(engine_rates),
        "trickle_tokens_per_s": summary(trickle_rates),
    }
    progress(
        f"paired x{runs}: added TTFT p50 {median(added_ms) or 0:.2f} ms, "
        f"tokens/s {median(ratios) or 0:.3f}x the engine, {failed} failed"
    )
    return out
