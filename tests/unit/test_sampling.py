"""Seeded sampling arithmetic (pure numpy)."""

from __future__ import annotations

import numpy as np

from worker.engine.sampling import apply_repetition_penalty, log_softmax, sample_token

LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05]))


def draws(seed: int, **options: float) -> list[int]:
    rng = np.random.default_rng(seed)
    temperature = float(options.get("temperature", 1.0))
    top_k = int(options.get("top_k", 0))
    top_p = float(options.get("top_p", 1.0))
    return [sample_token(LOGITS, temperature, top_k, top_p, rng) for _ in range(400)]


def test_same_seed_same_draws_and_different_seed_differs() -> None:
    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_frequencies_follow_the_distribution() -> None:
    counts = np.bincount(draws(1), minlength=4) / 400
    assert np.allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.07)


def test_top_k_and_top_p_cut_the_tail() -> None:
    assert set(draws(3, top_k=2)) == {0, 1}
    assert set(draws(3, top_p=0.7)) == {0, 1}  # 0.5 + 0.3 reaches 0.7
    assert set(draws(3, temperature=1e-4)) == {0}


def test_log_softmax_and_repetition_penalty() -> None:
    assert np.allclose(np.exp(log_softmax(LOGITS)), [0.5, 0.3, 0.15, 0.05])
    penalised = apply_repetition_penalty(np.array([2.0, -2.0, 1.0]), [0, 1], 2.0)
    assert penalised.tolist() == [1.0, -4.0, 1.0]


def test_top_k_of_one_is_greedy_and_top_p_renormalises() -> None:
    assert set(draws(5, top_k=1)) == {0}
    counts = np.bincount(draws(2, top_p=0.9), minlength=4) / 400
    # The tail (0.05) is cut and the rest renormalised: 0.5/0.95, 0.3/0.95, 0.15/0.95.
    assert counts[3] == 0
    assert np.allclose(counts[:3], [0.526, 0.316, 0.158], atol=0.07)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = np.array([0.5, -0.5, 3.0, 0.0])
    penalised = apply_repetition_penalty(logits, [0, 1, 3, 0], 2.0)
    assert penalised.tolist() == [0.25, -1.0, 3.0, 0.0]
    assert logits.tolist() == [0.5, -0.5, 3.0, 0.0]  # the input is left alone
    assert apply_repetition_penalty(logits, [], 2.0) is logits
    assert apply_repetition_penalty(logits, [0], 1.0) is logits
