"""A token's most likely alternatives at its step, for jobs that ask (``top_logprobs``).

Computed in the engine process from the step's logits (``return_logits_vocab``), so only a batch
of jobs that ask pays for the copy of the vocabulary's logits; such jobs share batches with
each other only (``policy.batches_with``), each row's logits found by
``worker.engine.shared_rows.RowLogits``. The log-probabilities are the log-softmax at the
temperature the job samples with (1 when greedy), top-k and top-p aside; the sampled token's
own value comes from the same distribution, so its entry matches its alternative.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from trickle.events import alternative_text
from trickle.tokenization import Tokenizer
from trickle.tokenization.interface import SPECIAL_MARK
from worker.engine.request import Logprob, Scored
from worker.engine.sampling import log_softmax


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


class Scores:
    """What each step reports with its token, in one engine process: CTranslate2's
    log-probability, or for a job with ``top_logprobs`` its alternatives (the vocabulary's
    texts are built at the first such job)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._texts: list[str] = []
        self._lock = threading.Lock()

    def for_job(
        self, count: int, top_k: int, temperature: float
    ) -> Callable[[Any, Callable[[], npt.NDArray[np.float64] | None]], Logprob]:
        """The step callback's scorer for a job asking ``count`` alternatives (greedy when
        ``top_k`` is 1: then at temperature 1): ``score(step, logits)``, ``logits`` giving
        the step's row of the job (read only when alternatives are asked)."""
        if not count:
            return _log_prob
        texts = self._vocabulary_texts()
        temperature = 1.0 if top_k == 1 else temperature

        def score(step: Any, row: Callable[[], npt.NDArray[np.float64] | None]) -> Logprob:
            logits = row()
            if logits is None:
                return float(step.log_prob)
            return scored(logits, int(step.token_id), count, temperature, texts)

        return score

    def _vocabulary_texts(self) -> list[str]:
        with self._lock:
            if not self._texts:
                special = self._tokenizer.special_ids  # named behind the mark: the name
                self._texts = [
                    alternative_text(spelled[len(SPECIAL_MARK) :] if i in special else spelled)
                    for i, spelled in enumerate(self._tokenizer.token_bytes())
                ]
            return self._texts


def _log_prob(step: Any, row: Callable[[], npt.NDArray[np.float64] | None]) -> Logprob:
    return step.log_prob  # type: ignore[no-any-return]


def row_logits(step: Any) -> npt.NDArray[np.float64] | None:
    """A step's logits for a batch of one, or None where CTranslate2 gave none (with more rows
    the first callback of a step gets every live row's: ``shared_rows.RowLogits``)."""
    try:
        return np.asarray(step.logits, dtype=np.float64).reshape(-1)
    except (ValueError, TypeError):
        return None
