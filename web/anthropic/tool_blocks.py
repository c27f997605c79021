"""A message with tools: its content blocks, and their stream events, from the tool-call
parser's reading of the job's text (``web.common.tools``, the parsers the OpenAI routes use).

Text becomes ``text`` blocks and calls ``tool_use`` blocks (``toolu_...`` ids derived from the
job), in the order the answer holds them. A stream opens each block with
``content_block_start`` (a ``tool_use`` block with its id, name and an empty ``input``), sends
``text_delta`` or ``input_json_delta`` (``partial_json``, the arguments as the model writes
them) deltas and closes it with ``content_block_stop``, as Anthropic documents. The job keeps
the model's raw text, so the stored answer, a stream and its replay read alike.
"""

from __future__ import annotations

import json
from typing import Any

from trickle.jobs import Job
from web.anthropic.models import AnthropicContent, StopReason
from web.anthropic.render import stop_reason
from web.common.tools.calls import tool_use_id
from web.common.tools.parser import CallArguments, CallEnd, CallStart, Event, Text, ToolCallParser


class ToolBlocks:
    """The blocks of one answer, built as its text is fed."""

    def __init__(self, job_id: str, parser: ToolCallParser):
        self._job_id = job_id
        self._parser = parser
        self.blocks: list[dict[str, Any]] = []  # text blocks' text, tool_use blocks' arguments
        self._open: int | None = None  # the index of the block not yet closed
        self._block_of: dict[int, int] = {}  # a call's index to its block's

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The stream events of the answer's next piece of text."""
        return self._events(self._parser.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        """The events of what the parser held back, the open block closed; an answer without
        any block has one empty text block, as a plain answer would."""
        events = self._events(self._parser.finish())
        events += self._close()
        if not self.blocks:
            events += [self._start_text(), *self._close()]
        return events

    def reopen(self) -> list[dict[str, Any]]:
        """The open block's start again: what a stream resumed inside it begins with."""
        if self._open is None:
            return []
        block = self.blocks[self._open]
        empty = {**block, "text": ""} if block["type"] == "text" else block
        return [_start(self._open, self._shape(empty, {}))]

    def content(self) -> list[AnthropicContent]:
        """The message's content, once the answer has ended."""
        return [self._shape(block, _input(block.get("arguments", ""))) for block in self.blocks]

    def stop_reason(self, job: Job) -> StopReason:
        return stop_reason(job, called=bool(self._block_of))

    def _events(self, parsed: list[Event]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for event in parsed:
            if isinstance(event, Text):
                if self._open is None or self.blocks[self._open]["type"] != "text":
                    events += self._close()
                    events.append(self._start_text())
                assert self._open is not None
                self.blocks[self._open]["text"] += event.text
                events.append(_delta(self._open, {"type": "text_delta", "text": event.text}))
            elif isinstance(event, CallStart):
                events += self._close()
                block = {"type": "tool_use", "call": event.index, "name": event.name}
                self._block_of[event.index] = self._begin({**block, "arguments": ""})
                events.append(_start(self._open, self._shape(block, {})))
            elif isinstance(event, CallArguments):
                at = self._block_of[event.index]
                self.blocks[at]["arguments"] += event.fragment
                events.append(
                    _delta(at, {"type": "input_json_delta", "partial_json": event.fragment})
                )
            elif isinstance(event, CallEnd) and self._open == self._block_of[event.index]:
                events += self._close()
        return events

    def _begin(self, block: dict[str, Any]) -> int:
        self.blocks.append(block)
        self._open = len(self.blocks) - 1
        return self._open

    def _start_text(self) -> dict[str, Any]:
        return _start(self._begin({"type": "text", "text": ""}), {"type": "text", "text": ""})

    def _close(self) -> list[dict[str, Any]]:
        at, self._open = self._open, None
        return [] if at is None else [{"type": "content_block_stop", "index": at}]

    def _shape(self, block: dict[str, Any], given: dict[str, Any]) -> Any:
        """The block as the API shows it, its ``input`` being ``given``."""
        if block["type"] == "text":
            return {"type": "text", "text": block["text"]}
        return {
            "type": "tool_use",
            "id": tool_use_id(self._job_id, block["call"]),
            "name": block["name"],
            "input": given,
        }


def _start(index: int | None, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _input(arguments: str) -> dict[str, Any]:
    """A call's ``input``: its arguments' JSON object. Arguments that are no JSON object (the
    model wrote something else) give ``{}``; the job's output keeps what it wrote."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def blocks_of_whole_answer(job: Job, parser: ToolCallParser) -> ToolBlocks:
    """The blocks of a finished job's stored output."""
    blocks = ToolBlocks(job.id, parser)
    blocks.feed(job.output)
    blocks.finish()
    return blocks
