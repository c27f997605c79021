"""Whether a constrained answer can fit its budget, checked before the job exists.

The engine closes an answer that ``max_tokens`` would cut with a completion its grammar allows
(``trickle.closure``); a budget below the shortest whole answer cannot be met at all, and the
answer would be cut where it stands, unparseable. So such a request is a 400 naming
``max_tokens``, with the shortest answer's length in the model's own tokens: the fewest a search
over the grammar's states finds (``trickle.closure_search``), not a greedy walk's estimate, so a
budget some whole answer fits is never refused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from trickle.closure import AnswerLength, Closer, proofs_hold
from trickle.grammar_matcher import GrammarFailed, MatcherCache
from trickle.params import GenerationParams
from trickle.tokenization import Tokenizer
from web.common.errors import invalid

# Shortest-answer lengths remembered per model (most recently used).
CACHED_LENGTHS = 256


class AnswerBudget:
    """One model's vocabulary as grammars see it, and the shortest answer of each grammar."""

    def __init__(self, tokenizer: Tokenizer):
        self._matchers = MatcherCache(tokenizer)
        self._closer = Closer(tokenizer.token_bytes())
        self._lengths: OrderedDict[str, AnswerLength] = OrderedDict()
        self._lock = threading.Lock()

    def shortest(self, grammar: str) -> AnswerLength:
        """What is known of the fewest tokens a whole answer takes (``Closer.answer_length``;
        where the grammar holds patterns or formats, the search's "none within" is not taken:
        its merging of states is inexact for some of them)."""
        with self._lock:
            if grammar in self._lengths:
                self._lengths.move_to_end(grammar)
                return self._lengths[grammar]
        length = self._closer.answer_length(self._matchers.matcher(grammar), proofs_hold(grammar))
        with self._lock:
            self._lengths[grammar] = length
            while len(self._lengths) > CACHED_LENGTHS:
                self._lengths.popitem(last=False)
        return length

    def check(self, params: GenerationParams, model: str) -> None:
        """A 400 on ``max_tokens`` when no whole answer fits it (or on the grammar, when it
        cannot run on this vocabulary); a budget some answer may fit is taken."""
        if params.grammar is None:
            return
        try:
            length = self.shortest(params.grammar)
        except GrammarFailed as exc:
            message = f"the answer's grammar cannot run on model {model!r}: {exc}"
            raise invalid(None, message) from None
        if length.found is None and length.least <= 1:
            # Neither the search nor the greedy walk reached the end of any answer, and the
            # search proved nothing: an answer cut at max_tokens could not be closed either,
            # so none is promised valid (Github_ultra o62897: every answer cut in a string).
            raise invalid(
                None,
                f"no whole answer the schema or tool call allows was found on model {model!r}"
                " (the closing search and the greedy walk both gave up): it cannot be enforced",
            )
        if params.max_tokens >= length.least:
            return
        exact = "" if length.found == length.least else "at least "
        raise invalid(
            "max_tokens",
            f"the shortest answer the schema or tool call allows is {exact}{length.least} "
            f"tokens on model {model!r}; max_tokens is {params.max_tokens}",
        )
