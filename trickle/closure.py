"""The short way out of a grammar: the tokens that close whatever is open.

When ``max_tokens`` is about to cut a constrained answer, the engine ends it with these tokens
instead, so the answer still parses (docs/structured-output.md). The completion is found
greedily: tokens the grammar forces first (llguidance's fast-forward: keys, ``:``, the rest of
a literal), else the first allowed token of ``CLOSERS`` (a closing quote or bracket ends the
innermost open value; ``0`` is the shortest JSON value), else the shortest allowed token. For
JSON that is the shortest completion in tokens but for minimum lengths and patterns, where it
takes the shortest allowed token each step; a greedy walk never backtracks, so each step costs
one mask.
"""

from __future__ import annotations

import llguidance
import numpy as np

from trickle.grammar_matcher import allowed_mask

# Most preferred first. Inside a string: its closing quote (with what may follow it). Elsewhere:
# closing brackets, then a separator (a value just ended: a required key follows), then the
# shortest values.
STRING_CLOSERS = ('"}', '"]', '"')
CLOSERS = ("}}", "]}", "}]", "]]", "}", "]", ",", "0", '""', "{}", "[]", '"', "{", "[")
# A letter the grammar allows only inside a string (JSON keywords aside, which are forced).
STRING_PROBE = "a"

# A completion longer than this is not searched for (the answer is then cut where it stands).
MAX_CLOSING_TOKENS = 512


class Closer:
    """Finds closing completions for one vocabulary."""

    def __init__(self, tokens: list[bytes]):
        ids = {token: i for i, token in enumerate(tokens)}
        self._in_string = [ids[c.encode()] for c in STRING_CLOSERS if c.encode() in ids]
        self._preferred = [ids[c.encode()] for c in CLOSERS if c.encode() in ids]
        self._probe = ids.get(STRING_PROBE.encode(), -1)
        # Special tokens last: a closing completion never needs one.
        self._lengths = np.array([len(t) if t and t[:1] != b"\xff" else 1 << 20 for t in tokens])
        self._vocab_size = len(tokens)

    def closing(self, matcher: llguidance.LLMatcher) -> list[int] | None:
        """The tokens that take ``matcher`` (left unchanged) to an accepting state; None when
        none is found within ``MAX_CLOSING_TOKENS``."""
        probe = matcher.deep_copy()
        out: list[int] = []
        while len(out) <= MAX_CLOSING_TOKENS:
            if probe.is_accepting():
                return out
            forced = probe.compute_ff_tokens()
            if not forced:
                forced = [self._pick(probe)]
            if probe.try_consume_tokens(forced) != len(forced) or probe.is_error():
                return None
            out.extend(forced)
        return None

    def length(self, matcher: llguidance.LLMatcher) -> int | None:
        closing = self.closing(matcher)
        return None if closing is None else len(closing)

    def _pick(self, matcher: llguidance.LLMatcher) -> int:
        allowed = allowed_mask(matcher, self._vocab_size)
        in_string = self._probe >= 0 and allowed[self._probe]
        for token in (*self._in_string, *self._preferred) if in_string else self._preferred:
            if allowed[token]:
                return token
        candidates = np.flatnonzero(allowed)
        if not len(candidates):
            return -1  # nothing is allowed: try_consume_tokens fails and the search ends
        return int(candidates[np.argmin(self._lengths[candidates])])
