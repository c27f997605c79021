"""Seeded jobs in the real engine process: the same seed gives the same tokens, whatever runs
beside it, including another seeded job on the other lane (worker.engine.seeded)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trickle.config.sections import ModelSettings
from worker.engine.engine import Engine
from worker.engine.request import EngineRequest, SamplingKey

SAMPLED = SamplingKey(1.0, 0, 1.0, 1.0, True)  # temperature 1, no top-k: every draw matters
TOKENS = 300


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Iterator[Engine]:
    settings = ModelSettings(name="demo", path=str(demo_model_dir), device="cpu", inter_threads=2)
    engine = Engine(settings)
    assert engine.settings.lanes == 2
    yield engine
    engine.close()


def run(engine: Engine, seed: int | None) -> tuple[list[int], float, float]:
    """One job's token ids, and when its first and last tokens arrived."""
    ids: list[int] = []
    moments: list[float] = []

    def on_step(position: int, step: int, token_id: int, logprob: float | None, last: bool) -> bool:
        ids.append(token_id)
        moments.append(time.monotonic())
        return False

    prompt = engine.tokenizer.encode("The socket module")
    engine.generate([EngineRequest(prompt, TOKENS, SAMPLED, seed)], on_step)
    return ids, moments[0], moments[-1]


def at_once(engine: Engine, seeds: list[int | None]) -> list[tuple[list[int], float, float]]:
    """One job per seed, each on its own thread, released together."""
    results: list[tuple[list[int], float, float] | None] = [None] * len(seeds)
    start = threading.Barrier(len(seeds))

    def one(index: int) -> None:
        start.wait()
        results[index] = run(engine, seeds[index])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(seeds))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(result is not None for result in results)
    return [result for result in results if result is not None]


def test_seeded_jobs_on_both_lanes_at_once_repeat_their_solo_tokens(engine: Engine) -> None:
    solo = {seed: run(engine, seed)[0] for seed in (11, 12)}
    assert len(solo[11]) == len(solo[12]) == TOKENS
    assert solo[11] != solo[12]  # a seed decides the draws
    assert run(engine, 11)[0] == solo[11]
    overlapped = 0
    for _ in range(6):
        first, second = at_once(engine, [11, 12])
        assert (first[0], second[0]) == (solo[11], solo[12])
        # Both ran at once (each began before the other ended): the lanes really overlapped.
        overlapped += first[1] < second[2] and second[1] < first[2]
    assert overlapped >= 1


def test_a_seeded_job_repeats_beside_unseeded_sampling(engine: Engine) -> None:
    solo = run(engine, 5)[0]
    unseeded = [at_once(engine, [5, None])[1][0] for _ in range(3)]
    for _ in range(3):
        assert at_once(engine, [None, 5])[1][0] == solo
    assert len({tuple(ids) for ids in unseeded}) > 1  # unseeded jobs still draw afresh
