"""Responses with tools: output items and numbered events from the parser's reading of the job.

Text becomes ``message`` items and calls ``function_call`` items, in the order the answer
holds them. The events are numbered as they are made from the job's tokens, one token at a
time, from token 0: the parser reads the same texts in the same order on every connection, so
a sequence number names the same event on each, and a resume after event K rebuilds the
sequence and sends what follows K. The whole stored output read at once gives the same items.

    0  response.created       1  response.in_progress
    then per item: output_item.added; a message's content_part.added, output_text.delta...,
    output_text.done, content_part.done; a call's function_call_arguments.delta...,
    function_call_arguments.done; output_item.done
    last: response.completed | incomplete | failed
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trickle.jobs import Job
from web.common.tools.calls import call_id, call_item_id
from web.common.tools.parser import CallArguments, CallEnd, CallStart, Event, Text, ToolCallParser
from web.openai.responses_api import render
from web.openai.responses_api.models import ResponseObject, ResponseStatus
from web.openai.responses_api.store import StoredResponse

TOOL_HEAD_EVENTS = 2  # created, in_progress


class ToolEvents:
    """The events and output items of one tool response, built token by token."""

    def __init__(self, record: StoredResponse, parser: ToolCallParser):
        self._record = record
        self._parser = parser
        self.sequence = TOOL_HEAD_EVENTS
        self.items: list[dict[str, Any]] = []
        self._message: dict[str, Any] | None = None  # the open message item
        self._messages = 0
        self._calls: dict[int, dict[str, Any]] = {}  # open call items by call index

    def head(self) -> list[dict[str, Any]]:
        return render.head_events(self._record)[:TOOL_HEAD_EVENTS]

    def token(self, text: str) -> list[dict[str, Any]]:
        return self._events(self._parser.feed(text))

    def end(self, job: Job) -> list[dict[str, Any]]:
        """What the parser held back, the open items closed, then the final event."""
        status = render.status_of(job)
        # What ends only with the answer (an unclosed call) is incomplete when it was cut.
        closing = "completed" if status == "completed" else "incomplete"
        events = self._events(self._parser.finish(), closing)
        events += self._close_message(closing)
        for index in list(self._calls):
            events += self._close_call(index, closing)
        final = self.response(job, status)
        last = {"completed": "response.completed", "failed": "response.failed"}
        # A canceled response ends as incomplete: OpenAI's stream has no cancelled event.
        return [*events, self._event(last.get(status, "response.incomplete"), response=final)]

    def response(self, job: Job, status: ResponseStatus) -> ResponseObject:
        return render.response_object(self._record, job, status, output=self.items)

    def _events(self, parsed: Iterable[Event], closing: str = "completed") -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for event in parsed:
            if isinstance(event, Text):
                events += self._text(event.text)
            elif isinstance(event, CallStart):
                events += self._close_message("completed")
                events += self._open_call(event)
            elif isinstance(event, CallArguments):
                item = self._calls[event.index]
                item["arguments"] += event.fragment
                place = {"item_id": item["id"], "output_index": self.items.index(item)}
                kind = "response.function_call_arguments.delta"
                events.append(self._event(kind, **place, delta=event.fragment))
            elif isinstance(event, CallEnd):
                events += self._close_call(event.index, closing)
        return events

    def _text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._message is None:
            item_id = self._record.item_id
            if self._messages:
                item_id = f"{item_id}_{self._messages}"
            self._messages += 1
            self._message = {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            self.items.append(self._message)
            events.append(self._added(self._message))
            events.append(
                self._event("response.content_part.added", **self._part(), part=_part(""))
            )
            self._message["content"] = [_part("")]
        part = self._message["content"][0]
        part["text"] += text
        events.append(
            self._event("response.output_text.delta", **self._part(), delta=text, logprobs=[])
        )
        return events

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        message, self._message = self._message, None
        if message is None:
            return []
        message["status"] = status
        part = message["content"][0]
        where = self._part(message)
        return [
            self._event("response.output_text.done", **where, text=part["text"], logprobs=[]),
            self._event("response.content_part.done", **where, part=dict(part)),
            self._done(message),
        ]

    def _open_call(self, start: CallStart) -> list[dict[str, Any]]:
        job_id = self._record.job_id
        item = {
            "id": call_item_id(job_id, start.index),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id(job_id, start.index),
            "name": start.name,
            "arguments": "",
        }
        self.items.append(item)
        self._calls[start.index] = item
        return [self._added(item)]

    def _close_call(self, index: int, status: str) -> list[dict[str, Any]]:
        item = self._calls.pop(index)
        item["status"] = status
        done = self._event(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=self.items.index(item),
            name=item["name"],
            arguments=item["arguments"],
        )
        return [done, self._done(item)]

    def _part(self, message: dict[str, Any] | None = None) -> dict[str, Any]:
        message = message or self._message
        assert message is not None
        return {
            "item_id": message["id"],
            "output_index": self.items.index(message),
            "content_index": 0,
        }

    def _added(self, item: dict[str, Any]) -> dict[str, Any]:
        snapshot = {**item, "content": []} if item["type"] == "message" else dict(item)
        return self._event(
            "response.output_item.added", output_index=self.items.index(item), item=snapshot
        )

    def _done(self, item: dict[str, Any]) -> dict[str, Any]:
        snapshot = dict(item)
        if item["type"] == "message":
            snapshot["content"] = [dict(part) for part in item["content"]]
        return self._event(
            "response.output_item.done", output_index=self.items.index(item), item=snapshot
        )

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def read_whole(record: StoredResponse, parser: ToolCallParser, job: Job) -> ToolEvents:
    """The response's items from its job's stored output (finished: the parser's end too)."""
    events = ToolEvents(record, parser)
    events.token(job.output)
    if job.status.is_terminal:
        events.end(job)
    return events
