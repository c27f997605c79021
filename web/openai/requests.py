"""Parse OpenAI-style completion and chat requests into Trickle jobs' parameters.

The shapes live in ``web.request_models``: fields Trickle cannot honour are accepted only with
their no-op value and refused otherwise, with a 400 naming them; what the schema cannot say
(cross-field rules, the chat template) is checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from trickle.config.settings import ConfigError, Settings
from trickle.jobs import GenerationParams
from trickle.model_files import model_profile
from web.chat_template import ChatTurn, render_chat
from web.errors import invalid, unavailable
from web.request_models import ChatCompletionRequest, ChatMessage, CompletionRequest, OpenAIFields
from web.validation import generation_params, served_model, validate


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
    params = generation_params(request, settings)
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
    params = generation_params(request, settings, max_tokens or request.max_tokens)
    messages = [_message(item, index) for index, item in enumerate(request.messages)]
    prompt = chat_prompt(messages, settings, served)
    return _request(RequestKind.CHAT, request, settings, (prompt,), params, logprobs)


def chat_prompt(
    messages: list[ChatTurn], settings: Settings, model: str, param: str = "messages"
) -> str:
    """The conversation through the model's template, with its own start and end tokens."""
    try:
        profile = model_profile(settings.model(model))
    except ConfigError as exc:  # the model directory's files are broken: not the client's fault
        raise unavailable(f"model {model!r} is not available: {exc}") from exc
    return render_chat(
        messages, profile.chat_template, profile.bos_token, profile.eos_token, param=param
    )


def _message(item: ChatMessage, index: int) -> ChatTurn:
    content = item.content
    if content is None:
        if item.role != "assistant":
            raise invalid(f"messages[{index}].content", "content is required for this role")
        content = ""
    text = content if isinstance(content, str) else "".join(part.text for part in content)
    return ChatTurn("system" if item.role == "developer" else item.role, text)


def _request(
    kind: RequestKind,
    request: OpenAIFields,
    settings: Settings,
    prompts: tuple[str, ...],
    params: GenerationParams,
    logprobs: int | None,
) -> OpenAIRequest:
    stream = bool(request.stream)
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
