"""Plain JSON tool calls: the whole answer is one call object, ``{"name": ..., "arguments":
{...}}`` (``"parameters"`` as Llama 3 writes it), or a list of them.

Whether an answer is a call is known only once it has ended and parses, so an answer that
starts with ``{`` or ``[`` is held back until then; any other answer streams as text at once.
"""

from __future__ import annotations

import json

from web.common.tools.hermes import call_of
from web.common.tools.parser import CallArguments, CallEnd, CallStart, Event, TextGate


class JsonParser:
    def __init__(self, max_calls: int | None = None):
        self._max_calls = max_calls
        self._gate = TextGate()
        self._held = ""
        self._mode: str | None = None  # "json" (held to the end) or "text", once known

    def feed(self, text: str) -> list[Event]:
        if self._mode == "text":
            return self._gate.text(text)
        self._held += text
        start = self._held.lstrip()
        if self._mode is None and start:
            self._mode = "json" if start[0] in "{[" else "text"
            if self._mode == "text":
                held, self._held = self._held, ""
                return self._gate.text(held)
        return []

    def finish(self) -> list[Event]:
        held, self._held = self._held, ""
        calls = _calls(held) if self._mode == "json" else None
        if calls is None:
            return [*self._gate.text(held), *self._gate.finish(False)]
        if self._max_calls is not None:
            calls = calls[: self._max_calls]
        events: list[Event] = []
        for index, (name, arguments) in enumerate(calls):
            events += [CallStart(index, name), CallArguments(index, arguments), CallEnd(index)]
        return events


def _calls(text: str) -> list[tuple[str, str]] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [call_of(item) for item in items]
    if not calls or any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]
