"""Hermes-style tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(NousResearch Hermes, Qwen2.5/3 and the built-in chat template's instructions).

Streams as vLLM's hermes parser does: a partial ``<tool_call>`` tag is held back, the function
name is sent once the object's ``"name"`` is complete and ``"arguments"`` opens an object, then
the arguments follow in fragments. The closing brace of the call object (and whitespace around
it) is held back until the call ends, since only then is it known not to be the arguments'.
A call whose object does not start that way is read whole at its end, and one that is not a
call at all is returned as text, tags included.
"""

from __future__ import annotations

import json
import re

from web.common.tools.parser import (
    CallArguments,
    CallEnd,
    CallStart,
    Event,
    TextGate,
    partial_suffix,
)

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
# The call object's head, up to the arguments object's opening brace (not consumed).
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)')
# What may close the call object rather than its arguments: held back until the call ends.
_HELD = frozenset(" \t\r\n}")


class HermesParser:
    def __init__(self, max_calls: int | None = None):
        self._max_calls = max_calls
        self._gate = TextGate()
        self._pending = ""  # text outside a call not yet reported (a partial open tag)
        self._body: str | None = None  # inside a call: its text so far
        self._args_at = -1  # where the arguments begin in the body, once the name was sent
        self._sent = 0  # characters of the arguments sent
        self._calls = 0  # calls reported (started)

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        searched = 0  # the closing tag cannot begin before this in the body
        if self._body is None:
            self._pending += text
        else:
            searched = max(len(self._body) - len(CLOSE) + 1, 0)
            self._body += text
        while True:
            if self._body is None:
                at = self._pending.find(OPEN)
                if at < 0:
                    keep = partial_suffix(self._pending, OPEN)
                    ready = self._pending[: len(self._pending) - keep]
                    self._pending = self._pending[len(ready) :]
                    if ready:
                        events += self._gate.text(ready)
                    return events
                if at:
                    events += self._gate.text(self._pending[:at])
                self._body, self._pending = self._pending[at + len(OPEN) :], ""
                self._args_at, self._sent, searched = -1, 0, 0
            end = self._body.find(CLOSE, searched)
            if end < 0:
                events += self._progress()
                return events
            body, self._pending, self._body = self._body[:end], self._body[end + len(CLOSE) :], None
            events += self._close(body, None)

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self._body is not None:
            # An unclosed call (the answer ended, or was cut): read what there is.
            raw, self._body = self._body, None
            events += self._close(raw[: len(raw) - partial_suffix(raw, CLOSE)], raw)
        elif self._pending:
            events += self._gate.text(self._pending)
            self._pending = ""
        return events + self._gate.finish(self._calls > 0)

    def _dropped(self) -> bool:
        return self._max_calls is not None and self._calls >= self._max_calls

    def _progress(self) -> list[Event]:
        """Inside an open call: the name once known, then the arguments that are settled."""
        assert self._body is not None
        if self._dropped():
            return []
        events: list[Event] = []
        if self._args_at < 0:
            head = _head(self._body)
            if head is None:
                return []
            self._args_at = head[0]
            events.append(self._start_named(head[1]))
        # Settled: up to a partial closing tag and the run of braces and spaces before it. The
        # text sent so far ends before such a run, so the run never reaches back into it.
        body = self._body
        start = self._args_at + self._sent
        end = len(body) - partial_suffix(body, CLOSE)
        while end > start and body[end - 1] in _HELD:
            end -= 1
        if end <= start:
            return events
        self._sent += end - start
        return [*events, CallArguments(self._calls - 1, body[start:end])]

    def _arguments(self, arguments: str) -> list[Event]:
        """The rest of the call's arguments, once they are all known."""
        fragment = arguments[self._sent :]
        self._sent = len(arguments)
        return [CallArguments(self._calls - 1, fragment)] if fragment else []

    def _close(self, body: str, unclosed: str | None) -> list[Event]:
        """The call's whole text has come: ``body`` up to its closing tag, or the answer
        ended first (``unclosed``: all of the text after the opening tag)."""
        if self._args_at < 0 and self._dropped():
            self._gate.call()
            return []
        events: list[Event] = []
        if self._args_at < 0:
            head = _head(body)
            if head is not None:
                self._args_at = head[0]
                events.append(self._start_named(head[1]))
            else:
                return self._whole(body, unclosed)
        arguments = body[self._args_at :].rstrip().removesuffix("}").rstrip()
        events += self._arguments(arguments)
        events.append(CallEnd(self._calls - 1))
        self._args_at = -1
        return events

    def _whole(self, body: str, unclosed: str | None) -> list[Event]:
        """A call object in another shape (keys in another order, arguments as a string), or
        no call at all: then it is text, tags included."""
        call = parse_call(body)
        if call is None:
            rest = f"{body}{CLOSE}" if unclosed is None else unclosed
            return self._gate.text(OPEN + rest)
        name, arguments = call
        start = self._start_named(name)
        return [start, CallArguments(start.index, arguments), CallEnd(start.index)]

    def _start_named(self, name: str) -> CallStart:
        self._gate.call()
        self._calls += 1
        return CallStart(self._calls - 1, name)


def _head(body: str) -> tuple[int, str] | None:
    """Where the arguments object begins, and the function's name, once both are known."""
    head = _HEAD.match(body)
    if head is None:
        return None
    try:
        return head.end(), json.loads(f'"{head.group(1)}"')
    except ValueError:  # an escape JSON does not know: not a call object
        return None


def parse_call(text: str) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` of a call object, ``arguments`` or ``parameters`` (Llama 3)
    holding an object or its JSON text; None when ``text`` is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return call_of(value)


def call_of(value: object) -> tuple[str, str] | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        return value["name"], arguments
    if isinstance(arguments, dict):
        return value["name"], json.dumps(arguments, ensure_ascii=False)
    return None
