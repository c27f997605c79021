"""What a tool-call parser reports while it reads a model's text, and the parser registry.

A parser is fed the answer's text in pieces (tokens as they stream, or the whole stored output
at once) and reports events. Whatever the cut, the events add up to the same answer, so a
stream, a replay and the stored response show one result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Text:
    """Answer text for the client (never part of a tool-call tag)."""

    text: str


@dataclass(frozen=True)
class CallStart:
    """Tool call ``index`` began; its function name is complete."""

    index: int
    name: str


@dataclass(frozen=True)
class CallArguments:
    """The next fragment of call ``index``'s arguments (a JSON text once all have come)."""

    index: int
    fragment: str


@dataclass(frozen=True)
class CallEnd:
    """Call ``index`` has all its arguments."""

    index: int


Event = Text | CallStart | CallArguments | CallEnd


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[Event]:
        """Events for ``text``, the answer's next piece; what may still turn out to be part of
        a tool call is held back."""

    def finish(self) -> list[Event]:
        """Events for what was held back, once the answer has ended."""


class TextGate:
    """Answer text around tool calls: whitespace that only separates calls (or follows the
    last one) is dropped, so an answer of calls has no content. An answer without calls keeps
    its text exactly."""

    def __init__(self) -> None:
        self._held = ""  # trailing whitespace not yet known to be content
        self.after_call = False  # the last thing seen was a tool call

    def text(self, text: str) -> list[Event]:
        if self.after_call:
            text = text.lstrip()
            if not text:
                return []
            self.after_call = False
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body) :]
        return [Text(body)] if body else []

    def call(self) -> None:
        """A call begins: whitespace before it is not content."""
        self._held = ""
        self.after_call = True

    def finish(self, had_calls: bool) -> list[Event]:
        held, self._held = self._held, ""
        return [Text(held)] if held and not had_calls else []


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (to hold back)."""
    at = text.find(tag[0], max(len(text) - len(tag) + 1, 0))
    while at >= 0:
        if tag.startswith(text[at:]):
            return len(text) - at
        at = text.find(tag[0], at + 1)
    return 0
