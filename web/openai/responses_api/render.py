"""Response objects and stream events of the Responses API, from a stored response and its job.

A response's event sequence is a function of its record, its job's token log and its job's
final state, nothing else, so a sequence number names the same event on every connection:

    0      response.created        3      response.content_part.added
    1      response.in_progress    4+i    response.output_text.delta of token i
    2      response.output_item.added
    4+N    response.output_text.done        6+N  response.output_item.done
    5+N    response.content_part.done       7+N  response.completed | incomplete | failed

(N: the tokens in the log; a token that released no text, a held partial character or the end
token, is a delta of ""). Resuming after event K is following the job after token K-4.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from trickle.events import TokenEvent, alternative_bytes, encode_text
from trickle.jobs import FinishReason, Job, JobStatus
from web.openai.responses_api.models import (
    IncompleteDetails,
    ItemStatus,
    OutputLogprob,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseObject,
    ResponseStatus,
    ResponseTextFormat,
    ResponseUsage,
    ToolChoice,
)
from web.openai.responses_api.store import StoredResponse
from web.streams.sse_events import typed_event

HEAD_EVENTS = 4  # created, in_progress, output_item.added, content_part.added
TAIL_EVENTS = 4  # output_text.done, content_part.done, output_item.done, the final one


def status_of(job: Job) -> ResponseStatus:
    if job.status is JobStatus.QUEUED:
        return "queued"
    if job.status is JobStatus.RUNNING:
        return "in_progress"
    if job.status in (JobStatus.FAILED, JobStatus.EXPIRED):
        return "failed"
    if job.status is JobStatus.CANCELED:
        return "cancelled"
    cut = job.finish_reason in (FinishReason.LENGTH, FinishReason.DEADLINE)
    return "incomplete" if cut else "completed"


def usage_of(job: Job) -> ResponseUsage:
    prompt, completion = job.usage.prompt_tokens, job.usage.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(
    record: StoredResponse,
    job: Job | None,
    status: ResponseStatus,
    logprobs: Sequence[TokenEvent] | None = None,
    output: Sequence[Any] | None = None,
) -> ResponseObject:
    """The response object; ``job`` None (or not started) has no output yet. ``logprobs``:
    the job's tokens, when the record asked for them. ``output``: the items of an answer read
    for tool calls (``tool_events``), instead of one message of the job's text."""
    items: list[Any] = []
    usage: ResponseUsage | None = None
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete: IncompleteDetails | None = None
    if job is not None and status != "queued":
        items = [message_item(record, job.output, _item_status(status), logprobs)]
        if output is not None:
            items = list(output)
    if job is not None and job.status.is_terminal:
        usage = usage_of(job)
        completed_at = int(job.completed_at or job.created_at)
    if status == "incomplete":
        incomplete = {"reason": "max_output_tokens"}
    if status == "failed" and job is not None:
        message = job.error.message if job.error else "generation failed"
        error = {"code": "server_error", "message": message}
    return {
        "id": record.id,
        "object": "response",
        "created_at": record.created_at,
        "status": status,
        "background": record.background,
        "completed_at": completed_at,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": record.instructions,
        "max_output_tokens": record.max_output_tokens,
        "max_tool_calls": None,
        "metadata": record.metadata,
        "model": record.model,
        "output": items,
        "parallel_tool_calls": record.parallel_tool_calls,
        "previous_response_id": record.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": record.store,
        "temperature": record.temperature,
        "text": {"format": cast(ResponseTextFormat, record.text_format), "verbosity": "medium"},
        "tool_choice": cast(ToolChoice, record.tool_choice),
        "tools": list(record.tools),
        "top_logprobs": record.top_logprobs,
        "top_p": record.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
    }


def _item_status(status: ResponseStatus) -> ItemStatus:
    if status == "completed":
        return "completed"
    return "in_progress" if status in ("queued", "in_progress") else "incomplete"


def message_item(
    record: StoredResponse,
    text: str | None,
    status: ItemStatus,
    logprobs: Sequence[TokenEvent] | None = None,
) -> OutputMessage:
    """The output message; ``text`` None: its content part has not been added yet."""
    content = [] if text is None else [text_part(text, logprobs)]
    return {
        "id": record.item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def text_part(text: str, logprobs: Sequence[TokenEvent] | None = None) -> OutputText:
    entries = [_part_logprob(token) for token in logprobs] if logprobs is not None else []
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": entries}


def _part_logprob(token: TokenEvent) -> OutputLogprob:
    return {
        "token": token.text,
        "bytes": list(token.text.encode("utf-8")),
        "logprob": _logprob(token.logprob),
        "top_logprobs": [
            {"token": text, "bytes": alternative_bytes(text), "logprob": logprob}
            for text, logprob in token.top or ()
        ],
    }


def _logprob(value: float | None) -> float:
    # The engine reports every sampled token's log-probability; a token replayed from a log
    # written without one (an older worker) reads as certain rather than breaking the schema.
    return 0.0 if value is None else value


def head_events(record: StoredResponse) -> list[dict[str, Any]]:
    """Events 0-3: they depend on the record alone."""
    first: ResponseStatus = "queued" if record.background else "in_progress"
    part = {"item_id": record.item_id, "output_index": 0, "content_index": 0}
    return [
        _event("response.created", 0, response=response_object(record, None, first)),
        _event("response.in_progress", 1, response=response_object(record, None, "in_progress")),
        _event(
            "response.output_item.added",
            2,
            output_index=0,
            item=message_item(record, None, "in_progress"),
        ),
        _event("response.content_part.added", 3, **part, part=text_part("")),
    ]


def tail_events(
    record: StoredResponse, job: Job, tokens: int, logprobs: Sequence[TokenEvent] | None
) -> list[dict[str, Any]]:
    """The last four events of a finished job whose log holds ``tokens`` tokens."""
    status = status_of(job)
    final = response_object(record, job, status, logprobs)
    seq = HEAD_EVENTS + tokens
    part = {"item_id": record.item_id, "output_index": 0, "content_index": 0}
    delta_logprobs = [_delta_logprob(t, record.top_logprobs) for t in logprobs or ()]
    last = {"completed": "response.completed", "failed": "response.failed"}
    return [
        _event("response.output_text.done", seq, **part, text=job.output, logprobs=delta_logprobs),
        _event("response.content_part.done", seq + 1, **part, part=text_part(job.output, logprobs)),
        _event("response.output_item.done", seq + 2, output_index=0, item=final["output"][0]),
        # A canceled response ends as incomplete: OpenAI's stream has no cancelled event.
        _event(last.get(status, "response.incomplete"), seq + 3, response=final),
    ]


def _event(kind: str, sequence_number: int, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "sequence_number": sequence_number, **fields}


def delta_event(record: StoredResponse, token: TokenEvent) -> str:
    """A delta with its token's log-probability (asked for: one event built per token)."""
    logprob = [_delta_logprob(token, record.top_logprobs)]
    return typed_event(_delta(record, HEAD_EVENTS + token.index, token.text, logprob))


def _delta_logprob(token: TokenEvent, top: int) -> dict[str, Any]:
    entry = {"token": token.text, "logprob": _logprob(token.logprob)}
    if token.top:
        alternatives = [{"token": text, "logprob": lp} for text, lp in token.top[:top]]
        return {**entry, "top_logprobs": alternatives}
    return {**entry, "top_logprobs": [entry] if top else []}


def _delta(
    record: StoredResponse, sequence_number: int, text: Any, logprobs: list[Any]
) -> dict[str, Any]:
    return _event(
        "response.output_text.delta",
        sequence_number,
        item_id=record.item_id,
        output_index=0,
        content_index=0,
        delta=text,
        logprobs=logprobs,
    )


# Stand for a delta's text and sequence number while its template is rendered (as in
# web.openai.responses.TextChunkTemplate: no token's literal can hold a NUL written this way).
_TEXT = "\x00text\x00"
_SEQUENCE = -(2**62)


class DeltaTemplate:
    """A response's delta event, rendered once per stream with its sequence number and text
    left open: a token's event is its number and its text's literal (as the worker encoded it)
    written between three fixed pieces, with no dict built or JSON encoded per token."""

    def __init__(self, record: StoredResponse):
        rendered = typed_event(_delta(record, _SEQUENCE, _TEXT, []))
        head, rest = rendered.split(str(_SEQUENCE))
        middle, tail = rest.split(encode_text(_TEXT))
        self._pieces = (head, middle, tail)

    def render(self, first_index: int, literals: Sequence[str]) -> str:
        """The delta events of consecutive tokens from token ``first_index`` on."""
        head, middle, tail = self._pieces
        sequence = HEAD_EVENTS + first_index
        return "".join(
            f"{head}{sequence + offset}{middle}{literal}{tail}"
            for offset, literal in enumerate(literals)
        )
