"""The engine process: CTranslate2 in a child of the worker, stopped per sequence by flags.

Real model, real child process: a stop asked by the worker reaches the engine within a couple
of steps, and an engine process that dies fails its batch with a clear error and is replaced.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trickle.config.sections import ModelSettings
from worker.engine.engine import Engine
from worker.engine.request import EngineError, EngineRequest, SamplingKey

GREEDY = SamplingKey(1.0, 1, 1.0, 1.0, True)


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Iterator[Engine]:
    engine = Engine(ModelSettings(name="demo", path=str(demo_model_dir), device="cpu"))
    yield engine
    engine.close()


def request(engine: Engine, max_new_tokens: int) -> EngineRequest:
    return EngineRequest(engine.tokenizer.encode("The socket module"), max_new_tokens, GREEDY)


def test_a_sequence_stops_soon_after_the_worker_asks(engine: Engine) -> None:
    seen: dict[int, int] = {0: 0, 1: 0}

    def on_step(position: int, step: int, token_id: int, logprob: float | None, last: bool) -> bool:
        seen[position] += 1
        return position == 0 and seen[0] >= 5  # the worker ends sequence 0 at its 5th token

    engine.generate([request(engine, 2000), request(engine, 300)], on_step)
    assert seen[1] == 300  # the other sequence ran to its own limit
    # Sequence 0 was stopped through its flag, not by its 2,000-token limit; tokens already
    # produced before the engine read the flag are bounded by the pipe's lag, a few steps.
    assert 5 <= seen[0] < 5 + 50


def test_max_new_tokens_is_enforced_in_the_engine_itself(engine: Engine) -> None:
    counts = [0, 0]

    def on_step(position: int, step: int, token_id: int, logprob: float | None, last: bool) -> bool:
        counts[position] += 1
        assert last == (counts[position] == (7, 19)[position])
        return False

    engine.generate([request(engine, 7), request(engine, 19)], on_step)
    assert counts == [7, 19]


def test_a_dead_engine_process_fails_its_batch_and_is_replaced(engine: Engine) -> None:
    started = threading.Event()

    def on_step(position: int, step: int, token_id: int, logprob: float | None, last: bool) -> bool:
        started.set()
        return False

    failure: list[BaseException] = []

    def run() -> None:
        try:
            engine.generate([request(engine, 100_000)], on_step)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(30)
    old_pid = engine._process.pid
    engine._process.kill()
    thread.join(30)
    assert not thread.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], EngineError)
    assert "engine process exited" in str(failure[0])
    # The next batch starts a new engine process and runs normally.
    count = [0]

    def counting(
        position: int, step: int, token_id: int, logprob: float | None, last: bool
    ) -> bool:
        count[0] += 1
        return False

    engine.generate([request(engine, 10)], counting)
    assert count[0] == 10
    assert engine._process.pid != old_pid


def test_the_engine_process_yields_the_cpu_to_the_serving_processes(engine: Engine) -> None:
    # engine_niceness (default 5): when cores are short, the worker and web tier go first.
    engine.generate([request(engine, 1)], lambda *_: False)  # the process is up
    pid = engine._process.pid
    assert pid is not None
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    niceness = engine.settings.tuning.engine_niceness
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(mine + niceness, 19)
