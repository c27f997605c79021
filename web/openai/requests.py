"""Parse OpenAI-style completion and chat requests into Trickle jobs' parameters.

The shapes live in ``web.common.request_models``: fields Trickle cannot honour are accepted only
with their no-op value and refused otherwise, with a 400 naming them; what the schema cannot say
(cross-field rules, the chat template) is checked here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from trickle.config.settings import Settings
from trickle.model_files import model_profile
from trickle.params import GenerationParams
from trickle.tokenization import load_tokenizer
from web.common.chat_template import (
    NAMED_TOOL_TEMPLATES,
    ChatTurn,
    TurnCall,
    reads_tools,
    render_chat,
)
from web.common.errors import invalid, unavailable
from web.common.request_models import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    OpenAIFields,
)
from web.common.structured import constrained, format_grammar
from web.common.tools.definitions import ToolUse, answer_grammar, chat_tools
from web.common.validation import generation_params, served_model, validate


class RequestKind(str, Enum):
    COMPLETION = "completion"
    CHAT = "chat"


@dataclass(frozen=True)
class OpenAIRequest:
    kind: RequestKind
    model: str
    prompts: tuple[str, ...]  # one per completion prompt; a chat has exactly one
    n: int
    params: GenerationParams
    stream: bool
    include_usage: bool
    continuous_usage: bool  # vLLM's continuous_usage_stats: usage in every chunk
    logprobs: int | None  # None: no logprobs; otherwise how many alternatives were asked for
    echo: bool
    tools: ToolUse | None = None  # a chat with tools: its answers are parsed for calls

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n


def parse_completion_request(
    body: Any, settings: Settings, model: type[CompletionRequest] = CompletionRequest
) -> OpenAIRequest:
    request = validate(model, body)
    if request.echo and request.logprobs is not None:
        raise invalid("echo", "echo together with logprobs is not supported")
    n = request.n or 1
    if request.best_of is not None and request.best_of != n:
        raise invalid("best_of", "best_of must equal n (server-side ranking is not supported)")
    params = generation_params(request, settings, served_model(request.model, settings))
    params = constrained(params, format_grammar(request.response_format, "response_format"))
    prompts = tuple(request.prompt)
    return _request(RequestKind.COMPLETION, request, settings, prompts, params, request.logprobs)


def parse_chat_request(
    body: Any, settings: Settings, model: type[ChatCompletionRequest] = ChatCompletionRequest
) -> OpenAIRequest:
    request = validate(model, body)
    served = served_model(request.model, settings)
    logprobs = None
    if request.logprobs:
        logprobs = request.top_logprobs or 0
    elif request.top_logprobs is not None:
        raise invalid("top_logprobs", "top_logprobs requires logprobs: true")
    max_tokens = request.max_completion_tokens
    params = generation_params(request, settings, served, max_tokens or request.max_tokens)
    messages = [_message(item, index) for index, item in enumerate(request.messages)]
    parser = settings.model(served).tool_call_parser
    tools = chat_tools(request.tools, request.tool_choice, request.parallel_tool_calls, parser)
    if tools is not None and tools.parser is not None and logprobs is not None:
        raise invalid("logprobs", "logprobs together with tools is not supported")
    grammar = answer_grammar(request.response_format, "response_format", tools)
    params = constrained(params, grammar)
    prompt = chat_prompt(messages, settings, served, tools=tools)
    parsed = _request(RequestKind.CHAT, request, settings, (prompt,), params, logprobs)
    return dataclasses.replace(parsed, tools=tools)


def chat_prompt(
    messages: list[ChatTurn],
    settings: Settings,
    model: str,
    param: str = "messages",
    tools: ToolUse | None = None,
) -> str:
    """The conversation (and tools) through the model's template, with its own start and end
    tokens. A template that never reads ``tools`` would drop them: that is a 400 unless the
    model's configuration names a fallback (``tool_chat_template``)."""
    model_settings = settings.model(model)
    try:
        profile = model_profile(model_settings)
        drop_bos = load_tokenizer(model_settings).drops_template_bos
    except ValueError as exc:  # its files are broken (ConfigError too): not the client's fault
        raise unavailable(f"model {model!r} is not available: {exc}") from exc
    template = profile.chat_template
    if tools is not None and not reads_tools(template):
        fallback = model_settings.tool_chat_template
        if not fallback:
            raise invalid(
                "tools",
                f"model {model!r}'s chat template cannot render tools (it never reads "
                f"'tools'); its configuration may name one that can: tool_chat_template",
            )
        template = NAMED_TOOL_TEMPLATES.get(fallback, fallback)
    definitions = list(tools.definitions) if tools is not None else None
    return render_chat(
        messages,
        template,
        profile.bos_token,
        profile.eos_token,
        param=param,
        tools=definitions,
        drop_bos=drop_bos,
    )


def _message(item: ChatMessage, index: int) -> ChatTurn:
    content = item.content
    at = f"messages[{index}]"
    if content is None:
        if item.role != "assistant":
            raise invalid(f"{at}.content", "content is required for this role")
        content = ""
    if item.tool_calls is not None and item.role != "assistant":
        raise invalid(f"{at}.tool_calls", "only an assistant message carries tool_calls")
    if item.role == "tool" and item.tool_call_id is None:
        raise invalid(f"{at}.tool_call_id", "a tool message needs the tool_call_id it answers")
    if item.role != "tool" and item.tool_call_id is not None:
        raise invalid(f"{at}.tool_call_id", "only a tool message carries tool_call_id")
    text = content if isinstance(content, str) else "".join(part.text for part in content)
    calls = tuple(
        TurnCall(call.id, call.function.name, call.function.arguments)
        for call in item.tool_calls or ()
    )
    role = "system" if item.role == "developer" else item.role
    return ChatTurn(role, text, calls, item.tool_call_id)


def _request(
    kind: RequestKind,
    request: OpenAIFields,
    settings: Settings,
    prompts: tuple[str, ...],
    params: GenerationParams,
    logprobs: int | None,
) -> OpenAIRequest:
    stream = bool(request.stream)
    if logprobs:  # the engine reports this many alternatives per token
        params = dataclasses.replace(params, top_logprobs=logprobs)
    options = request.stream_options
    if options is not None and not stream:
        raise invalid("stream_options", "stream_options is only allowed with stream: true")
    return OpenAIRequest(
        kind=kind,
        model=served_model(request.model, settings),
        prompts=prompts,
        n=request.n or 1,
        params=params,
        stream=stream,
        include_usage=bool(options and options.include_usage),
        continuous_usage=bool(options and options.continuous_usage_stats),
        logprobs=logprobs,
        echo=bool(getattr(request, "echo", False)),
    )
