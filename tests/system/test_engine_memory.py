"""The engine process gives a flood's memory back once it idles (worker/engine/malloc.py): its
resident size, read from /proc, grows while a batch of long sequences runs and comes back to
within 20% of its idle size soon after, where without the trim it stays at its peak."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from trickle.config.sections import ModelSettings
from trickle.config.tuning import ModelTuning
from worker.engine.engine import Engine
from worker.engine.request import EngineRequest, SamplingKey

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, /proc"),
]
SAMPLED = SamplingKey(0.8, 0, 1.0, 1.0, True)
IDLE_SECONDS = 0.5


def resident_mib(pid: int | None) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def settle(engine: Engine, seconds: float) -> float:
    """The engine's resident size once it stops changing (at most ``seconds``)."""
    deadline = time.monotonic() + seconds
    size = resident_mib(engine.process_id)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        size, before = resident_mib(engine.process_id), size
        if abs(size - before) < 0.5:
            break
    return size


def flood(engine: Engine) -> None:
    """One batch of 16 sampled sequences with long prompts: its buffers grow every step."""
    prompt = engine.tokenizer.encode("Once upon a time " * 40)
    requests = [EngineRequest(prompt, 256, SAMPLED) for _ in range(16)]
    engine.generate(requests, lambda *step: False)


@pytest.mark.parametrize("trim_after", [IDLE_SECONDS, 0.0], ids=["trimmed", "kept"])
def test_a_floods_memory_comes_back_once_the_engine_idles(
    demo_model_dir: Path, trim_after: float
) -> None:
    tuning = ModelTuning(engine_trim_after_idle_seconds=trim_after)
    settings = ModelSettings(name="demo", path=str(demo_model_dir), device="cpu", tuning=tuning)
    engine = Engine(settings)
    try:
        idle = settle(engine, 10)
        flood(engine)
        peak = resident_mib(engine.process_id)
        assert peak > idle * 1.3, (idle, peak)  # the flood grew it: there is something to give
        time.sleep(trim_after + 1.5)  # the idle spell, and the trim's own time
        after = settle(engine, 20)
        print(f"engine RSS: idle {idle:.0f} MiB, flood {peak:.0f} MiB, after {after:.0f} MiB")
        if trim_after:
            assert after <= idle * 1.2, (idle, peak, after)
        else:
            assert after > idle * 1.2, (idle, peak, after)  # without it the peak stays
    finally:
        engine.close()
