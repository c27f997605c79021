"""Rows that read their own logits share batches (pure logic: the demo tokenizer for the jobs'
sequence state, stand-ins for CTranslate2's step results): which jobs may batch together, how a
batched step's logits map to the rows that call back, and that a row whose logits do not match
its token is caught before it is used."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.test_policy import Holder, job
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer
from worker.engine.policy import alone, batches_with, restartable, runs_with_first
from worker.engine.shared_rows import RowLogits, RowsLost

GRAMMAR = '{"grammars": [{"lark_grammar": "start: /[a-z]+/"}]}'


@pytest.fixture(scope="module")
def holder(demo_model_dir: Path) -> Holder:
    tokenizer = SentencePieceTokenizer(str(demo_model_dir / "tokenizer.model"), add_bos=True)
    return Holder(tokenizer, tokenizer.eos_id)


def test_constrained_jobs_batch_with_each_other_and_never_with_plain_ones(holder: Holder) -> None:
    plain = [job(holder, 0), job(holder, 0)]
    constrained = [job(holder, 0, grammar=GRAMMAR) for _ in range(3)]
    scored = [job(holder, 0, top_logprobs=5)]
    assert not any(alone(j.request) for j in [*constrained, *scored])
    assert batches_with(constrained[1], constrained[0].request)
    assert batches_with(scored[0], constrained[0].request)  # both read their logits
    assert not batches_with(plain[0], constrained[0].request)
    assert not batches_with(constrained[0], plain[0].request)
    waiting = [constrained[0], plain[0], constrained[1], scored[0], plain[1], constrained[2]]
    assert runs_with_first(waiting) == [constrained[0], constrained[1], scored[0], constrained[2]]
    assert runs_with_first([plain[0], *constrained, plain[1]]) == [plain[0], plain[1]]
    # The engine process restarts its own rows: the scheduler's restarts leave them alone.
    assert not restartable(constrained[0].request) and restartable(plain[0].request)


def test_a_constrained_job_with_a_repetition_penalty_still_runs_alone(holder: Holder) -> None:
    """Its calls must be its own: CTranslate2 penalizes only what the call generated."""
    lone = job(holder, 0, grammar=GRAMMAR, repetition_penalty=1.3)
    assert alone(lone.request)
    assert runs_with_first([lone, job(holder, 0, grammar=GRAMMAR, repetition_penalty=1.3)]) == [
        lone
    ]


@dataclass
class Step:
    """What the callback reads of CTranslate2's GenerationStepResult."""

    step: int
    batch_id: int
    token_id: int
    log_prob: float
    logits: Any = None


def log_softmax(row: np.ndarray) -> np.ndarray:
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())  # type: ignore[no-any-return]


def steps_of(matrix: np.ndarray, order: list[int], step: int) -> list[Step]:
    """One step's callbacks: row k of ``matrix`` calls back as ``order[k]`` with its argmax;
    only the first holds the matrix (CTranslate2 moves it into the first callback)."""
    calls = []
    for k, batch_id in enumerate(order):
        token = int(np.argmax(matrix[k]))
        calls.append(Step(step, batch_id, token, float(log_softmax(matrix[k])[token])))
    calls[0].logits = matrix
    return calls


def test_the_kth_callback_of_a_step_reads_the_kth_live_row_after_those_still_prefilling() -> None:
    """Rows 0..3 with prompts of 3, 5, 3, 4 tokens: CTranslate2 sorts them longest first
    (1, 3, then 0 and 2), row 1 feeds its prompt for two steps and row 3 for one, and those
    rows lead the matrix while they do; a row that stops leaves the next step's matrix."""
    rng = np.random.default_rng(0)
    mapping = RowLogits([3, 5, 3, 4])
    # Step 0: rows 1 and 3 still prefill (matrix rows 0 and 1); rows 0 and 2 call back.
    matrix = rng.normal(size=(4, 50))
    for k, call in enumerate(steps_of(matrix[2:], [0, 2], 0)):
        call.logits = matrix if k == 0 else None
        index = mapping.index(call)
        assert index == 2 + k
        assert np.array_equal(mapping.row(index, call), matrix[2 + k])
    # Step 1: row 1 still prefills; rows 3, 0, 2 call back; row 0 stops at its token.
    matrix = rng.normal(size=(4, 50))
    for k, call in enumerate(steps_of(matrix[1:], [3, 0, 2], 1)):
        call.logits = matrix if k == 0 else None
        index = mapping.index(call)
        assert np.array_equal(mapping.row(index, call), matrix[1 + k])
        if call.batch_id == 0:
            mapping.ended(0)
    # Step 2: every live row calls back (1, 3, 2); row 0 is gone.
    matrix = rng.normal(size=(3, 50))
    for k, call in enumerate(steps_of(matrix, [1, 3, 2], 2)):
        index = mapping.index(call)
        assert index == k
        assert np.array_equal(mapping.row(index, call), matrix[k])


def test_a_row_whose_logits_do_not_match_its_token_is_caught() -> None:
    rng = np.random.default_rng(1)
    matrix = rng.normal(size=(2, 50))
    first, second = steps_of(matrix, [0, 1], 0)
    second.token_id, second.log_prob = first.token_id, first.log_prob  # row 0's, at row 1
    mapping = RowLogits([2, 2])
    mapping.row(mapping.index(first), first)
    with pytest.raises(RowsLost):
        mapping.row(mapping.index(second), second)


def test_a_step_without_its_rows_is_caught() -> None:
    """More callbacks than the matrix has rows: an order this mapping does not know."""
    matrix = np.random.default_rng(2).normal(size=(1, 50))
    calls = steps_of(np.vstack([matrix, matrix]), [0, 1], 0)
    calls[0].logits = matrix
    mapping = RowLogits([2, 2])
    mapping.row(mapping.index(calls[0]), calls[0])
    with pytest.raises(RowsLost):
        mapping.row(mapping.index(calls[1]), calls[1])
