"""The short way out of a grammar: the tokens that close whatever is open.

When ``max_tokens`` is about to cut a constrained answer, or the model ends before its grammar
does, the engine ends it with these tokens instead, so the answer still parses and validates
(docs/structured-output.md); the web tier refuses a budget that no whole answer fits.

Two ways find a completion. First a greedy walk, one mask a token: tokens the grammar forces
(llguidance's fast-forward: keys, ``:``, the rest of a literal), else the first allowed of
``CLOSERS`` (a closing quote or bracket ends the innermost open value; ``0`` is the shortest
JSON value), else the shortest allowed token. It finds most completions at once, but never
backtracks, so on its own it would circle where the way out is one particular character (an
email's ``@``, the ``.`` after a pattern's digits): when it meets the same mask at
``LOOP_CHOICES`` choices in a row, it takes the fewest tokens (up to ``LOOKAHEAD``, from the
search's candidates, one per byte class) after which the mask changes, a different way each
time that mask loops again, so a walk that left by a wrong way (a ``.`` in an email's local
part) tries another. Where it finds none within the limit, a bounded search over the
matcher's states does (``trickle.closure_search``): a limit is only reported unmet when that
search finds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import llguidance
import numpy as np
import numpy.typing as npt

from trickle.closure_search import MAX_EXPANSIONS, ClosingSearch

Mask = npt.NDArray[np.bool_]

# Most preferred first. Inside a string: its closing quote (with what may follow it). Elsewhere:
# closing brackets, then a separator (a value just ended: a required key follows), then the
# shortest values.
STRING_CLOSERS = ('"}', '"]', '"')
CLOSERS = ("}}", "]}", "}]", "]]", "}", "]", ",", "0", '""', "{}", "[]", '"', "{", "[")
# A letter the grammar allows only inside a string (JSON keywords aside, which are forced).
STRING_PROBE = "a"

# A completion longer than this is not searched for.
MAX_CLOSING_TOKENS = 512
# How far the greedy walk goes for a shortest-answer bound past the search's reach: tokens in
# all, and tokens it chose (the rest forced: keys, literals). A walk of forced tokens is cheap
# (a 73 KiB schema's 5,415 tokens: 60 ms on the demo); one that circles chooses every token
# (4,096 choices: 63 ms).
LONGEST_WALK = 16_384
LONGEST_WALK_CHOICES = 4096
# States a quick search expands (the engine's check of each token near max_tokens).
QUICK_EXPANSIONS = 40
# Choices in a row at one mask after which the greedy walk takes a way out of it, and how far
# it looks for one (tokens; tries in all).
LOOP_CHOICES = 2
LOOKAHEAD = 3
LOOKAHEAD_PROBES = 128
# The lookahead's tries in one walk, all loops together (a walk whose loops have ways out
# that lead back in would otherwise look again every time round).
WALK_PROBES = 1024


def proofs_hold(grammar: str) -> bool:
    """Whether the search's "no answer within its limit" can be taken for ``grammar``: not
    where it holds patterns or formats, whose states the search merges inexactly."""
    return '"pattern"' not in grammar and '"format"' not in grammar


@dataclass(frozen=True)
class AnswerLength:
    """What is known of a grammar's shortest answer: none is shorter than ``least`` tokens,
    and one of ``found`` tokens exists (None: no answer found)."""

    least: int
    found: int | None


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
        self._search = ClosingSearch(tokens, [*self._in_string, *self._preferred])

    def closing(
        self, matcher: llguidance.LLMatcher, limit: int = MAX_CLOSING_TOKENS, quick: bool = False
    ) -> list[int] | None:
        """Tokens that take ``matcher`` (left unchanged) to an accepting state, at most
        ``limit`` of them; None when the search finds none that short (``quick``: a search
        of a few states only, for a check that has a way out of its own)."""
        greedy = self.greedy(matcher, limit)
        if greedy is not None:
            return greedy
        expansions = QUICK_EXPANSIONS if quick else MAX_EXPANSIONS
        return self._search.closing(matcher, min(limit, MAX_CLOSING_TOKENS), expansions)

    def shortest(
        self, matcher: llguidance.LLMatcher, limit: int = MAX_CLOSING_TOKENS
    ) -> list[int] | None:
        """The fewest tokens that take ``matcher`` to an accepting state (within ``limit``):
        the search, bounded by what the greedy walk found."""
        greedy = self.greedy(matcher, limit)
        bound = limit if greedy is None else len(greedy) - 1
        found = self._search.closing(matcher, min(bound, MAX_CLOSING_TOKENS))
        return greedy if found is None else found

    def answer_length(self, matcher: llguidance.LLMatcher, proofs: bool = True) -> AnswerLength:
        """What is known of the shortest answer's length: the search's answer where it finds
        one (within 512 tokens); past its reach, the greedy walk's, up to ``LONGEST_WALK``
        tokens (a schema with a hundred required keys: every answer writes those keys; the
        walk writes each value with the fewest bytes, so it may be somewhat longer than the
        shortest, never shorter); with neither, none within the search's limit where it went
        through every state there (``proofs`` False: not taken, the search merging some
        patterns' states inexactly), else nothing.
        """
        greedy = self.greedy(matcher, LONGEST_WALK, LONGEST_WALK_CHOICES)
        bound = MAX_CLOSING_TOKENS if greedy is None else min(len(greedy) - 1, MAX_CLOSING_TOKENS)
        found, proved = self._search.search(matcher, bound)
        if found is not None:
            return AnswerLength(len(found), len(found))
        if greedy is not None:
            return AnswerLength(len(greedy), len(greedy))
        return AnswerLength(bound + 1 if proved and proofs else 1, None)

    def length(self, matcher: llguidance.LLMatcher, limit: int = MAX_CLOSING_TOKENS) -> int | None:
        closing = self.closing(matcher, limit)
        return None if closing is None else len(closing)

    def greedy(
        self, matcher: llguidance.LLMatcher, limit: int, choices: int | None = None
    ) -> list[int] | None:
        """The greedy walk's completion, if it is at most ``limit`` tokens (and it chose at
        most ``choices`` of them, the rest forced: a walk that circles chooses every token)."""
        probe = matcher.deep_copy()
        out: list[int] = []
        chosen = 0
        loop = _Loop()
        while len(out) <= limit:
            if probe.is_accepting():
                return out
            forced = probe.compute_ff_tokens()
            if not forced:
                chosen += 1
                if choices is not None and chosen > choices:
                    return None
                words = probe.compute_bitmask()
                allowed = _unpack(words, self._vocab_size)
                way_out = self._way_out(probe, words, allowed, loop) if loop.again(words) else []
                forced = way_out or [self._pick(allowed)]
            if probe.try_consume_tokens(forced) != len(forced) or probe.is_error():
                return None
            out.extend(forced)
        return None

    def _way_out(
        self, matcher: llguidance.LLMatcher, words: bytes, allowed: Mask, loop: _Loop
    ) -> list[int]:
        """Tokens after which ``words`` (the mask the walk circles in) changes: the fewest,
        breadth first over the mask's candidates, up to ``LOOKAHEAD`` tokens and
        ``LOOKAHEAD_PROBES`` tries (a URL's host leaves its repetition only after ``.`` and two
        letters); the walk's n-th time round that mask takes the n-th way found, in turn. Empty
        when none is found (a bounded repetition: the walk goes on as before)."""
        if words in loop.dead or loop.probes_left <= 0:
            return []
        candidates = self._search.candidates(allowed)
        turn = loop.ways_taken.get(words, 0)
        found: list[list[int]] = []
        level: list[tuple[list[int], llguidance.LLMatcher]] = [([], matcher)]
        budget = min(LOOKAHEAD_PROBES, loop.probes_left)
        for _ in range(LOOKAHEAD):
            deeper: list[tuple[list[int], llguidance.LLMatcher]] = []
            for path, state in level:
                for token in candidates:
                    if budget <= 0:
                        break
                    budget -= 1
                    loop.probes_left -= 1
                    probe = state.deep_copy()
                    if probe.try_consume_tokens([token]) != 1 or probe.is_error():
                        continue
                    if probe.compute_bitmask() == words:
                        deeper.append(([*path, token], probe))
                        continue
                    found.append([*path, token])
                    if len(found) > turn:
                        loop.ways_taken[words] = turn + 1
                        return found[turn]
            if found:  # fewer ways than turns: round again from the first
                loop.ways_taken[words] = 1
                return found[0]
            level = deeper
        loop.dead.add(words)  # no way out within reach: not looked for again this walk
        return []

    def _pick(self, allowed: Mask) -> int:
        in_string = self._probe >= 0 and allowed[self._probe]
        for token in (*self._in_string, *self._preferred) if in_string else self._preferred:
            if allowed[token]:
                return token
        candidates = np.flatnonzero(allowed)
        if not len(candidates):
            return -1  # nothing is allowed: try_consume_tokens fails and the search ends
        return int(candidates[np.argmin(self._lengths[candidates])])


class _Loop:
    """Whether the greedy walk is circling: the same mask at ``LOOP_CHOICES`` choices in a
    row (a repetition it keeps feeding, such as a pattern's digits given one after another)."""

    def __init__(self) -> None:
        self._last = b""
        self._repeats = 0
        # A mask -> where its next way out is tried from (a way out taken once that led back
        # into the loop, such as an email's ``.``, gives the next one its turn).
        self.ways_taken: dict[bytes, int] = {}
        self.dead: set[bytes] = set()  # masks with no way out within reach
        self.probes_left = WALK_PROBES  # the lookahead's tries left this walk

    def again(self, words: bytes) -> bool:
        self._repeats = self._repeats + 1 if words == self._last else 1
        self._last = words
        return self._repeats >= LOOP_CHOICES


def _unpack(words: bytes, vocab_size: int) -> Mask:
    """Which ids a matcher's bitmask (32-bit little-endian words) allows."""
    return np.unpackbits(np.frombuffer(words, dtype=np.uint8), bitorder="little")[
        :vocab_size
    ].astype(bool)
