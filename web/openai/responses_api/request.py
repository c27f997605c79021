"""``POST /v1/responses`` bodies: the pydantic model (validation and OpenAPI schema) and its
translation into a conversation and generation parameters.

Fields Trickle cannot honour (reasoning) are accepted only with their no-op value and refused
by name otherwise, as on the other OpenAI routes; ``text.format`` and forced tool calls are
kept by constrained decoding (``web.common.structured``). Function tools, ``function_call`` and
``function_call_output`` items are the conversation's tool calls and results (``web.common.tools``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trickle.config.settings import Settings
from trickle.params import GenerationParams
from web.common.chat_template import ChatTurn, TurnCall
from web.common.errors import invalid
from web.common.request_models import InputMessage, ResponseCreateRequest
from web.common.structured import constrained, format_echo
from web.common.tools.definitions import (
    Choice,
    ToolUse,
    answer_grammar,
    choice_name,
    responses_tools,
)
from web.common.tools.models import FunctionCallItem, FunctionCallOutputItem
from web.common.validation import generation_params, served_model, validate

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
    tool_choice: Choice
    tools: ToolUse | None = None
    # The tools as the response object echoes them (the request's, defaults filled in).
    tool_echo: tuple[dict[str, Any], ...] = ()
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})


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
    model_name = served_model(request.model, settings)
    parser = settings.model(model_name).tool_call_parser
    tools = responses_tools(request.tools, request.tool_choice, request.parallel_tool_calls, parser)
    if tools is not None and tools.parser is not None and logprobs:
        raise invalid("include", "output_text logprobs together with tools are not supported")
    text_format = request.text.format if request.text is not None else None
    params = generation_params(request, settings, model_name, request.max_output_tokens)
    params = constrained(params, answer_grammar(text_format, "text.format", tools))
    return ResponseRequest(
        model=model_name,
        messages=_messages(request.input),
        instructions=request.instructions,
        params=dataclasses.replace(
            params, top_logprobs=(request.top_logprobs or 0) if logprobs else 0
        ),
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
        tool_choice=choice_name(tools) if tools is not None else _plain(request.tool_choice),
        tools=tools,
        tool_echo=tuple(
            {**tool.model_dump(), "strict": bool(tool.strict)} for tool in request.tools or ()
        ),
        text_format=format_echo(text_format),
    )


def _plain(choice: object) -> Choice:
    """The echoed ``tool_choice`` of a request without tools."""
    return "none" if choice == "none" else "auto"


def _messages(
    items: str | list[InputMessage | FunctionCallItem | FunctionCallOutputItem],
) -> tuple[ChatTurn, ...]:
    """The input as turns: a ``function_call`` joins the assistant turn before it (or starts
    one), a ``function_call_output`` is a ``tool`` turn."""
    if isinstance(items, str):
        return (ChatTurn("user", items),)
    messages: list[ChatTurn] = []
    for item in items:
        if isinstance(item, FunctionCallItem):
            call = TurnCall(item.call_id, item.name, item.arguments)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                messages[-1] = ChatTurn("assistant", last.content, (*last.tool_calls, call))
            else:
                messages.append(ChatTurn("assistant", "", (call,)))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(ChatTurn("tool", item.output, tool_call_id=item.call_id))
        else:
            content = item.content
            text = content if isinstance(content, str) else "".join(p.text for p in content)
            messages.append(ChatTurn("system" if item.role == "developer" else item.role, text))
    return tuple(messages)
