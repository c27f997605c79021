"""What a message stream writes for its job's tokens: a text answer's one text block, or with
tools the blocks the parser reads (``web.anthropic.tool_blocks``).

Resuming after token n (``Last-Event-ID``) sends the head again, then what followed token n. A
text answer's tokens come from n+1 on. With tools the parser reads every token from the first
on each connection, so the same events are made at the same tokens; those made at token n or
before are not sent again, except the start of the block still open after n, which the resumed
stream begins with (as a text answer's head holds its block's start).
"""

from __future__ import annotations

import json

from trickle.events import TokenRun
from trickle.jobs import Job
from web.anthropic import render
from web.anthropic.tool_blocks import ToolBlocks
from web.common.tools.parser import ToolCallParser
from web.streams.sse_events import typed_event


class TextWriter:
    """An answer without tools: one text block, a delta per wake-up's tokens."""

    def __init__(self, job: Job, model: str):
        self._job = job
        self._model = model
        self._template = render.TextDeltaTemplate()

    def head(self) -> str:
        return render.head(self._job, self._model)

    def tokens(self, run: TokenRun) -> list[str]:
        literal = run.text_literal()
        if literal == '""':  # held text (a partial character) is no delta
            return []
        return [self._template.render(run.end - 1, literal)]

    def end(self, job: Job) -> list[str]:
        return [render.tail(job)]


class ToolWriter:
    """An answer read for tool calls, token by token: each event's SSE ``id`` is the token
    it was made at."""

    def __init__(self, job: Job, model: str, parser: ToolCallParser, after: int):
        self._job = job
        self._model = model
        self._blocks = ToolBlocks(job.id, parser)
        self._after = after
        self._resumed = after < 0  # nothing to begin again on a new stream

    def head(self) -> str:
        return render.message_start(self._job, self._model) + render.PING

    def tokens(self, run: TokenRun) -> list[str]:
        parts: list[str] = []
        for index, literal in zip(run.indexes, run.literals, strict=True):
            if index > self._after:
                parts += self._resume()
            events = self._blocks.feed(json.loads(literal))
            if index > self._after:
                parts += [f"id: {index}\n{typed_event(event)}" for event in events]
        return parts

    def end(self, job: Job) -> list[str]:
        parts = self._resume()
        parts += [typed_event(event) for event in self._blocks.finish()]
        reason = self._blocks.stop_reason(job)
        return [*parts, render.tail(job, reason, text_block=False)]

    def _resume(self) -> list[str]:
        if self._resumed:
            return []
        self._resumed = True
        return [typed_event(event) for event in self._blocks.reopen()]
