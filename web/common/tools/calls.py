"""A parser's events gathered into an answer: its text and its tool calls, with the ids every
route gives them. Ids are derived from the job, so a stream, its replay and the stored answer
name each call alike."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from web.common.tools.parser import CallArguments, CallStart, Event, Text, ToolCallParser


@dataclass
class ToolCall:
    name: str
    arguments: str = ""


@dataclass
class ParsedAnswer:
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def add(self, events: Iterable[Event]) -> None:
        for event in events:
            if isinstance(event, Text):
                self.content += event.text
            elif isinstance(event, CallStart):
                self.calls.append(ToolCall(event.name))
            elif isinstance(event, CallArguments):
                self.calls[event.index].arguments += event.fragment


def parse_answer(parser: ToolCallParser, text: str, finished: bool = True) -> ParsedAnswer:
    """The answer in ``text`` (its end not yet reached unless ``finished``)."""
    answer = ParsedAnswer()
    answer.add(parser.feed(text))
    if finished:
        answer.add(parser.finish())
    return answer


def _digest(job_id: str, index: int) -> str:
    return hashlib.sha256(f"{job_id}:{index}".encode()).hexdigest()[:24]


def call_id(job_id: str, index: int) -> str:
    """The id of the job's ``index``-th tool call (``call_...``, as OpenAI's)."""
    return f"call_{_digest(job_id, index)}"


def tool_use_id(job_id: str, index: int) -> str:
    """The Messages API id of the same call's ``tool_use`` block (``toolu_...``)."""
    return f"toolu_{_digest(job_id, index)}"


def call_item_id(job_id: str, index: int) -> str:
    """The Responses API id of its ``function_call`` output item (``fc_...``)."""
    return f"fc_{_digest(job_id, index)}"
