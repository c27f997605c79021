"""Stop sequences: hold back text that could still turn into a stop string.

A stop string may span several tokens, so text is released only once no stop sequence can start
inside it; text that becomes part of a stop is never released.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopCheck:
    released: str
    stopped: bool
    # The stop string that matched ("" when none did): Anthropic's answers name it.
    stop: str = ""


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self._stops = [stop for stop in stops if stop]
        self._held = ""

    def feed(self, text: str) -> StopCheck:
        """Add new text; return what is safe to stream and whether a stop sequence matched."""
        if not self._stops:
            return StopCheck(text, False)
        buffer = self._held + text
        match = _earliest_match(buffer, self._stops)
        if match is not None:
            self._held = ""
            position, stop = match
            return StopCheck(buffer[:position], True, stop)
        hold = _longest_partial_suffix(buffer, self._stops)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return StopCheck(buffer[: len(buffer) - hold], False)

    def flush(self) -> str:
        """Release held text when generation ends for another reason."""
        held, self._held = self._held, ""
        return held


def _earliest_match(buffer: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """Where the earliest stop starts, and which (the first listed wins a tie)."""
    found = [(pos, stop) for stop in stops if (pos := buffer.find(stop)) >= 0]
    return min(found, key=lambda match: match[0]) if found else None


def _longest_partial_suffix(buffer: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of buffer that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(buffer)), best, -1):
            if buffer.endswith(stop[:length]):
                best = length
                break
    return best
