"""Streamed chat answers with tools, as OpenAI streams them: each call's name once (with its
``call_...`` id and its index), then its arguments in fragments, ``finish_reason:
"tool_calls"`` last, and never a partial tool-call tag as text.

The parser reads the job's text on the web side, so the stored output stays the model's raw
text and a replay of the job renders the same answer.
"""

from __future__ import annotations

from typing import Any

from trickle.jobs import Job
from web.common.tools.calls import ParsedAnswer, call_id
from web.common.tools.parser import CallArguments, CallStart, Event, Text, ToolCallParser
from web.openai.responses import Envelope, chat_chunk, tool_finish_reason


class ToolChoiceStream:
    """One streamed choice: its text through the parser, out as chunks."""

    def __init__(self, envelope: Envelope, index: int, job_id: str, parser: ToolCallParser):
        self._envelope = envelope
        self._index = index
        self._job_id = job_id
        self._parser = parser
        self.answer = ParsedAnswer()

    def feed(self, text: str) -> list[dict[str, Any]]:
        return self._chunks(self._parser.feed(text))

    def finish(self, job: Job) -> list[dict[str, Any]]:
        """What the parser held back, then the chunk with the finish reason."""
        chunks = self._chunks(self._parser.finish())
        reason = tool_finish_reason(job, self.answer)
        return [*chunks, chat_chunk(self._envelope, self._index, {}, reason)]

    def _chunks(self, events: list[Event]) -> list[dict[str, Any]]:
        self.answer.add(events)
        chunks: list[dict[str, Any]] = []
        text = ""  # consecutive text events are one chunk
        for event in events:
            if isinstance(event, Text):
                text += event.text
                continue
            if text:
                chunks.append(self._delta({"content": text}))
                text = ""
            if isinstance(event, CallStart):
                call = {
                    "index": event.index,
                    "id": call_id(self._job_id, event.index),
                    "type": "function",
                    "function": {"name": event.name, "arguments": ""},
                }
                chunks.append(self._delta({"tool_calls": [call]}))
            elif isinstance(event, CallArguments):
                call = {"index": event.index, "function": {"arguments": event.fragment}}
                chunks.append(self._delta({"tool_calls": [call]}))
        if text:
            chunks.append(self._delta({"content": text}))
        return chunks

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return chat_chunk(self._envelope, self._index, delta)
