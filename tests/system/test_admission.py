"""Admission while every lane is busy, and the one restart entry point, against CTranslate2
alone: every greedy output equals the engine's own ``generate_batch`` of that prompt, token id
for token id, and every replay log equals the stored text. Real engine process, real publisher,
real Redis; the float32 random Llama-style model (greedy output is exact there across restarts,
see tests/conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import ctranslate2
import pytest
import redis

from tests.scheduler_harness import CPU_LIKE, Harness
from tests.system.test_rebalancing import assert_logged_in_order, greedy
from worker.engine.engine import Engine
from worker.engine.restart import RowResume

PROMPTS = ["Return the number of items", "A socket", "If the value is", "Raise", "This", "The"]


class Oracle:
    """CTranslate2 alone, in the test process: greedy ids after a prompt of ids."""

    def __init__(self, model_dir: Path, engine: Engine):
        self.tokenizer = engine.tokenizer
        self.generator = ctranslate2.Generator(
            str(model_dir), device="cpu", intra_threads=1, compute_type="float32"
        )

    def ids(self, prompt_ids: Sequence[int], max_tokens: int) -> list[int]:
        (result,) = self.generator.generate_batch(
            [self.tokenizer.to_pieces(list(prompt_ids))],
            max_length=max_tokens,
            sampling_topk=1,
            include_prompt_in_result=False,
            end_token=[],
        )
        return list(result.sequences_ids[0])


@pytest.fixture(scope="module")
def oracle(llama_model_dir: Path, llama_engine: Engine) -> Iterator[Oracle]:
    made = Oracle(llama_model_dir, llama_engine)
    yield made
    made.generator.unload_model()


def test_newcomers_admitted_beside_a_busy_lane_match_ctranslate2_alone(
    llama_engine: Engine, oracle: Oracle, private_redis: redis.Redis
) -> None:
    """One ordinary lane runs a long job 30 tokens in (joining it would pause it past the
    40 ms budget), and six jobs arrive 5 ms apart: the first starts on an overflow lane at
    once, the next ones join that young batch by a restart. The runner is never restarted,
    every newcomer ends before it, and every output is CTranslate2's alone."""
    assert llama_engine.lanes.spare >= 1
    harness = Harness(
        llama_engine, private_redis, 8, wait_ms=0, rebatch_max_stall_ms=40,
        rebatch_wait_ratio=4, engine_threads=1, pricing=CPU_LIKE,
        spare_lanes=llama_engine.lanes.spare,
    )  # fmt: skip
    try:
        runner = harness.job(**greedy("The", 1500))  # type: ignore[arg-type]
        newcomers = [
            # Long enough that the first is still running when the last comes, however fast
            # the machine (at 40 tokens they could end first, and nothing then had to join).
            harness.job(**greedy(prompt, 200 + 10 * index))  # type: ignore[arg-type]
            for index, prompt in enumerate(PROMPTS)
        ]
        harness.scheduler.submit(runner)
        deadline = time.monotonic() + 30
        while runner.state.count < 30:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        # The first starts on an overflow lane; once it speaks (a busy machine can be slow to
        # wake that lane, and a lane that wakes late takes every arrival in one batch: nothing
        # to restart), the others arrive 5 ms apart and join its batch.
        harness.scheduler.submit(newcomers[0])
        while newcomers[0].first_token_at is None:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        for job in newcomers[1:]:
            time.sleep(0.005)
            harness.scheduler.submit(job)
        for job in [runner, *newcomers]:
            assert job.ended.wait(120)
        assert harness.scheduler.restarts >= 1 and runner.restarts == 0
        assert runner.last_token_at is not None
        for job in newcomers:
            assert job.last_token_at is not None and job.last_token_at < runner.last_token_at
    finally:
        harness.close()
    for job in [runner, *newcomers]:
        expected = oracle.ids(job.request.prompt_ids, job.request.max_new_tokens)
        assert job.generated_ids == expected, job.request.prompt_ids
        assert_logged_in_order(private_redis, job.job_id, len(expected), job.state.output)


def test_a_row_restarted_with_a_forced_token_goes_on_from_its_prefix_and_that_token(
    llama_engine: Engine, oracle: Oracle, private_redis: redis.Redis
) -> None:
    """``restart_rows`` with a ``RowResume``: the row keeps what it streamed, the forced id is
    streamed as its next token, and the row then generates exactly what CTranslate2 alone
    generates after prompt + prefix + that id; the rest of the batch goes on unchanged. Once
    the batch has ended, a restart is refused and changes nothing."""
    harness = Harness(llama_engine, private_redis, 8, wait_ms=0, engine_threads=1)
    try:
        forced_row = harness.job(**greedy("The", 120))  # type: ignore[arg-type]
        other_row = harness.job(**greedy("The", 120))  # type: ignore[arg-type]
        plain = oracle.ids(forced_row.request.prompt_ids, 120)
        forced = next(i for i in range(5, 2000) if i not in plain)
        harness.scheduler.submit(forced_row)
        harness.scheduler.submit(other_row)
        deadline = time.monotonic() + 30
        while forced_row.state.count < 20:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        batch = harness.scheduler.running_batch(forced_row)
        assert batch is not None
        rows = [(forced_row, RowResume(forced=(forced,)))]
        assert harness.scheduler.restart_rows(batch, rows=rows)
        assert forced_row.ended.wait(60) and other_row.ended.wait(60)
        assert not harness.scheduler.restart_rows(batch, rows=rows)
    finally:
        harness.close()
    generated = forced_row.generated_ids
    cut = generated.index(forced)
    assert cut >= 20 and generated[:cut] == plain[:cut]
    prefix = [*forced_row.request.prompt_ids, *generated[: cut + 1]]
    assert generated[cut + 1 :] == oracle.ids(prefix, 120 - cut - 1)
    assert len(generated) == forced_row.state.count == 120
    assert other_row.generated_ids == plain and other_row.restarts == 1
    for job in (forced_row, other_row):
        assert_logged_in_order(private_redis, job.job_id, 120, job.state.output)
