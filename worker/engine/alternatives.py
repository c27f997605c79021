"""A token's most likely alternatives at its step, for jobs that ask (``top_logprobs``).

Computed in the engine process from the step's logits (``return_logits_vocab``), so only a job
that asks pays for the copy of the vocabulary's logits; such a job runs alone
(``policy.alone``). The log-probabilities are the log-softmax at the temperature the job
samples with (1 when greedy), top-k and top-p aside; the sampled token's own value comes from
the same distribution, so its entry matches its alternative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from trickle.events import Alternatives
from worker.engine.sampling import log_softmax


@dataclass(frozen=True, slots=True)
class Scored:
    """What the engine process sends instead of a bare log-probability for such a job."""

    logprob: float
    top: Alternatives


# What the engine reports with each token: its log-probability, with alternatives when asked.
Logprob = float | Scored | None


def scored(
    logits: npt.NDArray[np.float64], token: int, count: int, temperature: float, texts: list[str]
) -> Scored:
    """The sampled ``token``'s log-probability and the ``count`` most likely tokens (best first)
    among the ``texts`` the tokenizer has (a padded output layer's extra ids are left out)."""
    values = log_softmax(logits[: len(texts)] / max(temperature, 1e-6))
    count = min(count, len(values))
    best = np.argpartition(-values, count - 1)[:count]
    best = best[np.argsort(-values[best], kind="stable")]
    chosen = float(values[token]) if token < len(values) else float("-inf")
    return Scored(chosen, tuple((texts[i], float(values[i])) for i in best))
