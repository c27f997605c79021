"""Sampling from one step's logits in Python, as CTranslate2's sampler does it (temperature,
top-k, top-p, CTRL repetition penalty), with a random generator the caller owns: for decoding
CTranslate2 cannot do by itself, such as resampling under a constraint on the next token.
Seeded jobs do not come here: they run on CTranslate2's own sampler (worker.engine.seeded).
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
