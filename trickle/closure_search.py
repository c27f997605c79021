"""The shortest way out of a grammar, searched: a best-first search over the matcher's states.

A greedy walk (``trickle.closure``) finds most closing completions with one mask a token, but
it never backtracks, so it can circle for ever where the way out is a particular character: an
email's ``@``, a date-time's ``T``, a pattern's literal. This search cannot: it expands states
in order of tokens spent (Dijkstra with each token costing one, a run of forced tokens its
length), so the first accepting state it reaches is reached with the fewest tokens, and it
stops when that count passes ``limit`` or after ``MAX_EXPANSIONS`` states, whichever first.
That bound is the proof it ends.

The matcher's state is opaque, so the search cannot tell states apart exactly. Two things keep
it small:

- from each state it tries one token per class of first byte (digits, lowercase letters,
  uppercase letters, bytes past ASCII; every other byte is a class of its own), the shortest
  and the longest allowed one, besides the closing tokens (``"``, ``}``...): a grammar that
  treats all letters alike (a string, an email's local part) is explored once, not per letter;
- two states are one when their masks are equal and so is their JSON shape (``_Shape``: the
  brackets, separators and literals of the completion so far, string contents and digits left
  out, so an array's item count or an object's depth tells states apart); the first reached
  (fewest tokens) is kept, and a later one only where it consumed more bytes without its mask
  changing (in a string with a minimum length or a pattern's repetition, that progress is
  never further from the end).

Both are exact for the grammars a JSON Schema yields but for patterns that tell apart letters
of one class and still allow the same next tokens; there the search may return a longer
completion than the shortest, or none within its bound, never an invalid one, since every
state it reaches is one the matcher accepted.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import llguidance
import numpy as np
import numpy.typing as npt

from trickle.grammar_matcher import allowed_mask

# States expanded at most per search (each a mask and a few dozen copies: milliseconds).
MAX_EXPANSIONS = 600
# First bytes of what JSON allows outside strings (literals start with t, f, n; numbers hold
# e, E), and of what follows a value or a key.
_OUTSIDE = frozenset(b'{}[],:"-+.0123456789tfneE \t\r\n')
_AFTER_VALUE = frozenset(b":,]}")
# Byte classes whose members a search tries only one of.
_DIGITS = 1 << 9
_LOWER = _DIGITS + 1
_UPPER = _DIGITS + 2
_HIGH = _DIGITS + 3
_SPECIAL = _DIGITS + 4  # empty or special pieces: never tried


# (tokens spent, order pushed, the state): fewest tokens first, then first found.
_Entry = tuple[int, int, "_State"]


@dataclass
class _State:
    matcher: llguidance.LLMatcher
    path: list[int]
    shape: _Shape
    parent: tuple[str, bool, bytes] | None  # the key of the state it came from
    run: int  # bytes consumed since the key last changed


class ClosingSearch:
    """Shortest-completion searches for one vocabulary (its pieces as bytes)."""

    def __init__(self, tokens: list[bytes], preferred: list[int]):
        self._tokens = tokens
        self._vocab_size = len(tokens)
        self._lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        self._classes = np.array([_byte_class(t) for t in tokens], dtype=np.int64)
        # Ids by length, shortest first: the first allowed of a class is its shortest.
        self._by_length = np.argsort(self._lengths, kind="stable")
        self._preferred = preferred
        firsts = [t[0] if t and t[:1] != b"\xff" else -1 for t in tokens]
        self._string_only = np.array([b >= 0 and b not in _OUTSIDE for b in firsts])
        self._after_value = np.array([b in _AFTER_VALUE for b in firsts])

    def closing(
        self, matcher: llguidance.LLMatcher, limit: int, most: int = MAX_EXPANSIONS
    ) -> list[int] | None:
        """The fewest tokens that take ``matcher`` (left unchanged) to an accepting state, if
        some take at most ``limit``; None when none do (or ``most`` states were expanded)."""
        return self.search(matcher, limit, most)[0]

    def search(
        self, matcher: llguidance.LLMatcher, limit: int, most: int = MAX_EXPANSIONS
    ) -> tuple[list[int] | None, bool]:
        """``closing``'s answer, and whether a None is a finding: every state within ``limit``
        was reached before ``most`` expansions ran out, so no completion is that short."""
        order = itertools.count()
        start = _State(matcher.deep_copy(), [], _Shape(False), None, 0)
        frontier: list[_Entry] = [(0, next(order), start)]
        best: dict[tuple[str, bool, bytes], int] = {}  # a key -> the longest run expanded
        expansions = 0
        while frontier and expansions < most:
            spent, _, state = heapq.heappop(frontier)
            if state.matcher.is_accepting():
                return state.path, False
            if spent >= limit or state.matcher.is_error():
                continue
            forced = state.matcher.compute_ff_tokens()
            if forced:  # one way on: no choice to search
                cost = spent + len(forced)
                if state.matcher.try_consume_tokens(forced) == len(forced) and cost <= limit:
                    state.path = [*state.path, *forced]
                    state.shape = state.shape.after(b"".join(self._tokens[t] for t in forced))
                    heapq.heappush(frontier, (cost, next(order), state))
                continue
            mask = allowed_mask(state.matcher, self._vocab_size)
            state.shape = state.shape.inside(self._in_string(mask))
            key = (state.shape.text, state.shape.in_string, np.packbits(mask).tobytes())
            run = state.run if key == state.parent else 0
            if best.get(key, -1) >= run:
                continue  # reached before, with no fewer tokens and at least this progress
            best[key] = run
            expansions += 1
            for token in self.candidates(mask):
                probe = state.matcher.deep_copy()
                if probe.try_consume_tokens([token]) != 1 or probe.is_error():
                    continue
                piece = self._tokens[token]
                child = _State(
                    probe, [*state.path, token], state.shape.after(piece), key, run + len(piece)
                )
                heapq.heappush(frontier, (spent + 1, next(order), child))
        return None, not frontier

    def _in_string(self, mask: npt.NDArray[np.bool_]) -> bool | None:
        """Whether a string is open where ``mask`` is allowed, where the mask tells: a byte
        only a string holds (a letter no JSON literal starts with), or else one that follows
        a value or key (``:``, ``,``, a closing bracket)."""
        if (mask & self._string_only).any():
            return True
        if (mask & self._after_value).any():
            return False
        return None

    def candidates(self, mask: npt.NDArray[np.bool_]) -> list[int]:
        """The closing tokens allowed, then the shortest and the longest allowed token of each
        byte class."""
        ordered = self._by_length[mask[self._by_length]]
        classes = self._classes[ordered]
        keep = classes != _SPECIAL
        ordered, classes = ordered[keep], classes[keep]
        if not len(ordered):
            return []
        _, shortest = np.unique(classes, return_index=True)
        _, from_end = np.unique(classes[::-1], return_index=True)
        longest = len(ordered) - 1 - from_end
        chosen = [t for t in self._preferred if mask[t]]
        for index in (*shortest, *longest):
            token = int(ordered[index])
            if token not in chosen:
                chosen.append(token)
        return chosen


def _byte_class(token: bytes) -> int:
    """The class a piece's first byte puts it in (its byte, or one of the shared classes)."""
    if not token or token[:1] == b"\xff":
        return _SPECIAL
    first = token[0]
    if 0x30 <= first <= 0x39:
        return _DIGITS
    if 0x61 <= first <= 0x7A:
        return _LOWER
    if 0x41 <= first <= 0x5A:
        return _UPPER
    if first >= 0x80:
        return _HIGH
    return first


@dataclass(frozen=True)
class _Shape:
    """A completion's JSON structure so far: its brackets, separators and literals, with the
    text of strings and the digits of numbers left out (two states that differ only there are
    one to the search, but for the progress inside the open one), and whether a string is
    open. Outside JSON it is a coarse, safe key: more states kept apart than needed."""

    in_string: bool
    text: str = ""
    escaped: bool = False

    def inside(self, in_string: bool | None) -> _Shape:
        """The shape with the open string as the matcher's mask tells it (None: it cannot)."""
        if in_string is None or in_string == self.in_string:
            return self
        return _Shape(in_string, self.text)

    def after(self, piece: bytes) -> _Shape:
        text, in_string, escaped = [self.text], self.in_string, self.escaped
        for byte in piece:
            if in_string:
                if escaped:
                    escaped = False
                elif byte == 0x5C:  # backslash
                    escaped = True
                elif byte == 0x22:
                    in_string = False
                    text.append('"')
            elif byte == 0x22:
                in_string = True
                text.append('"')
            elif 0x30 <= byte <= 0x39:
                if not text[-1].endswith("0"):
                    text.append("0")
            else:
                text.append(chr(byte))
        return _Shape(in_string, "".join(text), escaped)
