"""The message object and the stream's events, from a job: Anthropic's documented shapes.

A stream is ``message_start``, ``content_block_start`` (one text block), ``ping``, one
``content_block_delta`` per wake-up's tokens, ``content_block_stop``, ``message_delta`` (the
stop reason and the usage), ``message_stop``; a quiet spell sends ``ping``. Every delta carries
an SSE ``id``: the index of its last token, which is what ``Last-Event-ID`` resumes after. A
message with tools has its blocks from ``web.anthropic.tool_blocks`` between the same head and
tail.
"""

from __future__ import annotations

from trickle.events import encode_text
from trickle.jobs import FinishReason, Job
from web.anthropic.models import AnthropicContent, AnthropicUsage, MessageObject, StopReason
from web.streams.sse_events import typed_event

MESSAGE_PREFIX = "msg_"
JOB_PREFIX = "job_"
PING = 'event: ping\ndata: {"type": "ping"}\n\n'


def message_id(job_id: str) -> str:
    """The message a job answers: ``job_<hex>`` is ``msg_<hex>``."""
    return MESSAGE_PREFIX + job_id.removeprefix(JOB_PREFIX)


def stop_reason(job: Job, called: bool = False) -> StopReason:
    """``called``: the answer holds tool calls (``tool_use``, unless it was cut short)."""
    if job.finish_reason in (FinishReason.LENGTH, FinishReason.DEADLINE):
        return "max_tokens"  # cut short: by max_tokens, or by its deadline
    if called:
        return "tool_use"
    # A job canceled through /v1/jobs/<id>/cancel ended at its tenant's request: a turn's end.
    return "stop_sequence" if job.stop_sequence else "end_turn"


def stop_sequence(reason: StopReason, job: Job) -> str | None:
    return (job.stop_sequence or None) if reason == "stop_sequence" else None


def message_usage(job: Job, output_tokens: int | None = None) -> AnthropicUsage:
    return {
        "input_tokens": job.usage.prompt_tokens,
        "output_tokens": job.usage.completion_tokens if output_tokens is None else output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_object(
    job: Job,
    model: str,
    finished: bool = True,
    content: list[AnthropicContent] | None = None,
    reason: StopReason | None = None,
) -> MessageObject:
    """The message of a finished job (``content`` and ``reason``: read for tool calls, else
    its text); ``finished=False``: the empty one a stream starts with."""
    if finished and reason is None:
        reason = stop_reason(job)
    if content is None:
        content = [{"type": "text", "text": job.output}] if finished else []
    return {
        "id": message_id(job.id),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": reason,
        "stop_sequence": stop_sequence(reason, job) if reason is not None else None,
        "usage": message_usage(job, None if finished else 0),
    }


def message_start(job: Job, model: str) -> str:
    start = {"type": "message_start", "message": message_object(job, model, finished=False)}
    return typed_event(start)


def head(job: Job, model: str) -> str:
    """The events before the first token of a text answer."""
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    return message_start(job, model) + typed_event(block) + PING


def tail(job: Job, reason: StopReason | None = None, text_block: bool = True) -> str:
    """The events after the last token of a finished job (``text_block``: closing the one
    text block of an answer without tools)."""
    reason = stop_reason(job) if reason is None else reason
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": stop_sequence(reason, job)},
        "usage": message_usage(job),
    }
    close = typed_event({"type": "content_block_stop", "index": 0}) if text_block else ""
    return close + typed_event(delta) + typed_event({"type": "message_stop"})


# Stands for a delta's text while its template is rendered (as in web.openai.responses: no
# token's literal can hold a NUL written this way).
_TEXT = "\x00text\x00"


class TextDeltaTemplate:
    """A text delta event rendered once per stream with its id and text left open: a wake-up's
    tokens are one event, their joined literal written between fixed pieces (no dict built or
    JSON encoded per event)."""

    def __init__(self) -> None:
        event = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}}
        event["delta"]["text"] = _TEXT  # type: ignore[index]
        self._before, self._after = typed_event(event).split(encode_text(_TEXT))

    def render(self, last_index: int, text_literal: str) -> str:
        return f"id: {last_index}\n{self._before}{text_literal}{self._after}"
