"""Build OpenAI-shaped response objects and stream chunks from Trickle jobs and token events."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from trickle.events import TokenEvent, alternative_bytes, encode_text
from trickle.jobs import FinishReason, Job
from web.common.tools.calls import ParsedAnswer, call_id
from web.openai.json_pieces import Lazy
from web.openai.requests import OpenAIRequest, RequestKind


@dataclass(frozen=True)
class Envelope:
    """The fields every object and chunk of one response shares."""

    id: str
    created: int
    model: str
    job_ids: tuple[str, ...]


def finish_reason(job: Job) -> str:
    # OpenAI knows only stop and length; a job canceled through /cancel ended at our request,
    # one its deadline stopped was cut short, as by max_tokens.
    cut = job.finish_reason in (FinishReason.LENGTH, FinishReason.DEADLINE)
    return "length" if cut else "stop"


def tool_finish_reason(job: Job, answer: ParsedAnswer) -> str:
    """``tool_calls`` when the answer called a tool and was not cut short."""
    if answer.calls and job.finish_reason is not FinishReason.LENGTH:
        return "tool_calls"
    return finish_reason(job)


def tool_message(job: Job, answer: ParsedAnswer) -> dict[str, Any]:
    """The assistant message of a finished answer (without calls: exactly a plain one)."""
    if not answer.calls:
        return {"role": "assistant", "content": answer.content}
    return {
        "role": "assistant",
        "content": answer.content or None,
        "tool_calls": [
            {
                "id": call_id(job.id, index),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for index, call in enumerate(answer.calls)
        ],
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def forced_as_certain(logprob: float | None) -> float:
    """A token with no model step (one a grammar forced) reads as certain: the schemas say a
    number, and no distribution was drawn from."""
    return 0.0 if logprob is None else logprob


def completion_logprobs(
    events: Sequence[TokenEvent], text_offset: int, lazy: bool = False
) -> dict[str, Any]:
    """Legacy completions shape: each token's alternatives (the sampled token alone for a
    request that asked for none); ``lazy``: arrays made as they are written (json_pieces)."""

    def offsets() -> Iterator[int]:
        at = text_offset
        for event in events:
            yield at
            at += len(event.text)

    arrays = {
        "tokens": (event.text for event in events),
        "token_logprobs": (forced_as_certain(event.logprob) for event in events),
        "top_logprobs": (
            dict(event.top) if event.top else {event.text: forced_as_certain(event.logprob)}
            for event in events
        ),
        "text_offset": offsets(),
    }
    return {name: Lazy(array) if lazy else list(array) for name, array in arrays.items()}


def chat_logprobs(events: Sequence[TokenEvent], top: int, lazy: bool = False) -> dict[str, Any]:
    def entry(event: TokenEvent) -> dict[str, Any]:
        return {
            "token": event.text,
            "logprob": forced_as_certain(event.logprob),
            "bytes": list(event.text.encode("utf-8")),
        }

    def alternatives(event: TokenEvent) -> list[dict[str, Any]]:
        if event.top:
            return [
                {"token": text, "logprob": logprob, "bytes": alternative_bytes(text)}
                for text, logprob in event.top[:top]
            ]
        return [entry(event)] if top > 0 else []

    content = ({**entry(event), "top_logprobs": alternatives(event)} for event in events)
    return {"content": Lazy(content) if lazy else list(content)}


def _base(envelope: Envelope, kind: str) -> dict[str, Any]:
    return {
        "id": envelope.id,
        "object": kind,
        "created": envelope.created,
        "model": envelope.model,
        "system_fingerprint": None,
        "job_ids": list(envelope.job_ids),
    }


def completion_choice(
    index: int, text: str, reason: str | None, logprobs: dict[str, Any] | None
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}


def chat_choice(
    index: int, text: str, reason: str, logprobs: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": logprobs,
        "finish_reason": reason,
    }


def completion_chunk(
    envelope: Envelope,
    index: int,
    text: str,
    reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = completion_choice(index, text, reason, logprobs)
    return {**_base(envelope, "text_completion"), "choices": [choice]}


def chat_chunk(
    envelope: Envelope,
    index: int,
    delta: dict[str, Any],
    reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
    return {**_base(envelope, "chat.completion.chunk"), "choices": [choice]}


# Stands for a chunk's text while its template is rendered: no token's text can hold a NUL
# literal written this way, since the template is split on the placeholder's literal alone.
_PLACEHOLDER = "\x00text\x00"
_PLACEHOLDER_LITERAL = encode_text(_PLACEHOLDER)


class TextChunkTemplate:
    """One choice's token chunk with its text left open, rendered once per stream: a wake-up's
    tokens become one chunk by writing their joined text's literal between the two halves, with
    no dict built or JSON encoded per chunk (vLLM renders its frames from a per-stream template
    the same way). The output is exactly ``data: json.dumps(chunk)``."""

    def __init__(self, chunk: dict[str, Any]):
        rendered = f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        self._before, self._after = rendered.split(_PLACEHOLDER_LITERAL)

    def render(self, text_literal: str) -> str:
        return self._before + text_literal + self._after


def text_chunk_template(envelope: Envelope, index: int, chat: bool) -> TextChunkTemplate:
    if chat:
        return TextChunkTemplate(chat_chunk(envelope, index, {"content": _PLACEHOLDER}))
    return TextChunkTemplate(completion_chunk(envelope, index, _PLACEHOLDER))


def usage_chunk(envelope: Envelope, kind: str, usage_: dict[str, int]) -> dict[str, Any]:
    return {**_base(envelope, kind), "choices": [], "usage": usage_}


def prompt_tokens(req: OpenAIRequest, jobs: Sequence[Job]) -> int:
    # Counted once per prompt, as OpenAI does, however many samples were drawn from it.
    return sum(jobs[i * req.n].usage.prompt_tokens for i in range(len(req.prompts)))


def choice_prompts(req: OpenAIRequest) -> list[str]:
    return [prompt for prompt in req.prompts for _ in range(req.n)]


def result_object(
    req: OpenAIRequest,
    envelope: Envelope,
    finished: Sequence[tuple[Job, list[TokenEvent]]],
    lazy: bool = False,
) -> dict[str, Any]:
    """The whole non-streamed response, from each choice's finished job and its tokens;
    ``lazy``: its logprobs arrays made as ``json_pieces`` writes them."""
    choices = [
        _choice(req, index, job, events, prompt, lazy)
        for index, ((job, events), prompt) in enumerate(
            zip(finished, choice_prompts(req), strict=True)
        )
    ]
    completion_tokens = sum(job.usage.completion_tokens for job, _ in finished)
    usage_ = usage(prompt_tokens(req, [job for job, _ in finished]), completion_tokens)
    kind = "chat.completion" if req.kind is RequestKind.CHAT else "text_completion"
    return {**_base(envelope, kind), "choices": choices, "usage": usage_}


def _choice(
    req: OpenAIRequest, index: int, job: Job, events: list[TokenEvent], prompt: str, lazy: bool
) -> dict[str, Any]:
    reason = finish_reason(job)
    wants_logprobs = req.logprobs is not None
    if req.kind is RequestKind.CHAT:
        logprobs = chat_logprobs(events, req.logprobs or 0, lazy) if wants_logprobs else None
        answer = req.tools.parse(job.output) if req.tools is not None else None
        if answer is not None:
            choice = chat_choice(index, job.output, tool_finish_reason(job, answer), logprobs)
            return {**choice, "message": tool_message(job, answer)}
        return chat_choice(index, job.output, reason, logprobs)
    text = (prompt if req.echo else "") + job.output
    logprobs = completion_logprobs(events, 0, lazy) if wants_logprobs else None
    return completion_choice(index, text, reason, logprobs)
