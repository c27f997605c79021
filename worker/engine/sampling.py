"""Seeded sampling done by Trickle itself, from the model's per-step logits.

CTranslate2 4.x has no per-call seed: its random generator is per engine thread and seeded once,
so a seed cannot make one job repeatable. For jobs that ask for a seed, the engine instead asks
CTranslate2 for the next-token logits and samples here with a generator owned by the job, which
makes the output a function of (model, prompt, parameters, seed) alone, whatever else runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def log_softmax(logits: FloatArray) -> FloatArray:
    shifted = logits - np.max(logits)
    normalised: FloatArray = shifted - np.log(np.sum(np.exp(shifted)))
    return normalised


def apply_repetition_penalty(logits: FloatArray, seen: Sequence[int], penalty: float) -> FloatArray:
    """CTRL-style penalty, as CTranslate2 applies it: shrink the logits of tokens already seen."""
    if penalty == 1.0 or not seen:
        return logits
    logits = logits.copy()
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    values = logits[ids]
    logits[ids] = np.where(values > 0, values / penalty, values * penalty)
    return logits


def sample_token(
    logits: FloatArray,
    temperature: float,
    top_k: int,
    top_p: float,
    rng: np.random.Generator,
) -> int:
    """Draw one token id: temperature, then top-k, then nucleus (top-p) filtering."""
    scaled = logits / max(temperature, 1e-6)
    order = np.argsort(-scaled, kind="stable")
    if top_k > 0:
        order = order[:top_k]
    probs = np.exp(log_softmax(scaled[order]))
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
        order, probs = order[:keep], probs[:keep]
        probs = probs / probs.sum()
    return int(order[rng.choice(len(order), p=probs)])
