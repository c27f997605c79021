"""``POST /v1/responses`` bodies: the pydantic model (validation and OpenAPI schema) and its
translation into a conversation and generation parameters.

Fields Trickle cannot honour (tools, structured output, reasoning) are accepted only with their
no-op value and refused by name otherwise, as on the other OpenAI routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from trickle.config.settings import Settings
from trickle.jobs import GenerationParams
from web.chat_template import ChatTurn
from web.errors import invalid
from web.request_models import InputMessage, ResponseCreateRequest
from web.validation import generation_params, served_model, validate

LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass(frozen=True)
class ResponseRequest:
    """A validated ``POST /v1/responses``: the new messages (the stored conversation before
    them is the caller's to prepend) and what the response object echoes back."""

    model: str
    messages: tuple[ChatTurn, ...]
    instructions: str | None
    params: GenerationParams
    max_output_tokens: int | None
    stream: bool
    background: bool
    store: bool
    metadata: dict[str, str]
    previous_response_id: str | None
    logprobs: bool
    top_logprobs: int
    parallel_tool_calls: bool
    tool_choice: Literal["none", "auto"]


def parse_response_request(
    body: Any, settings: Settings, model: type[ResponseCreateRequest] = ResponseCreateRequest
) -> ResponseRequest:
    request = validate(model, body)
    background = bool(request.background)
    store = True if request.store is None else request.store
    if background and not store:
        raise invalid("background", "background responses must be stored (store: true)")
    if request.stream_options is not None and not request.stream:
        raise invalid("stream_options", "stream_options is only allowed with stream: true")
    logprobs = LOGPROBS_INCLUDE in (request.include or [])
    if request.top_logprobs and not logprobs:
        raise invalid("top_logprobs", f"top_logprobs needs include: [{LOGPROBS_INCLUDE!r}]")
    return ResponseRequest(
        model=served_model(request.model, settings),
        messages=_messages(request.input),
        instructions=request.instructions,
        params=generation_params(request, settings, request.max_output_tokens),
        max_output_tokens=request.max_output_tokens,
        stream=bool(request.stream),
        background=background,
        store=store,
        metadata=dict(request.metadata or {}),
        previous_response_id=request.previous_response_id,
        logprobs=logprobs,
        top_logprobs=request.top_logprobs or 0,
        parallel_tool_calls=(
            True if request.parallel_tool_calls is None else request.parallel_tool_calls
        ),
        tool_choice=request.tool_choice or "auto",
    )


def _messages(items: str | list[InputMessage]) -> tuple[ChatTurn, ...]:
    if isinstance(items, str):
        return (ChatTurn("user", items),)
    messages = []
    for item in items:
        content = item.content
        text = content if isinstance(content, str) else "".join(part.text for part in content)
        messages.append(ChatTurn("system" if item.role == "developer" else item.role, text))
    return tuple(messages)
