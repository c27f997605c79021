"""Parse OpenAI-style completion and chat requests into Trickle jobs' parameters.

Fields Trickle cannot honour are refused with a 400 naming them rather than silently ignored; the
sampling fields go through the same validator as the native job API.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from web.chat_template import parse_messages, render_chat
from web.errors import invalid
from web.validation import (
    SAMPLING_FIELDS,
    boolean,
    optional_integer,
    parse_model,
    parse_sampling,
    require_encodable,
)
from worker.config import Settings
from worker.jobs import GenerationParams

MAX_CHOICES = 8
MAX_PROMPTS = 16
MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20
# Accepted for compatibility, with no effect on generation.
IGNORED_FIELDS = frozenset({"user", "metadata", "store", "service_tier"})
COMMON_FIELDS = SAMPLING_FIELDS | {"model", "n", "stream", "stream_options"} | IGNORED_FIELDS
COMMON_FIELDS |= {"frequency_penalty", "presence_penalty", "logit_bias"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "logprobs", "echo", "suffix", "best_of"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}
CHAT_FIELDS |= {"response_format", "tools", "tool_choice", "parallel_tool_calls"}


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
    logprobs: int | None  # None: no logprobs; otherwise how many alternatives were asked for
    echo: bool

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n


def parse_completion_request(body: Any, settings: Settings) -> OpenAIRequest:
    body = _object(body, COMPLETION_FIELDS)
    prompts = _prompts(body.get("prompt"))
    if body.get("suffix") not in (None, ""):
        raise invalid("suffix", "suffix is not supported")
    logprobs = optional_integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    echo = boolean(body, "echo", False)
    if echo and logprobs is not None:
        raise invalid("echo", "echo together with logprobs is not supported")
    n = optional_integer(body, "n", 1, MAX_CHOICES) or 1
    best_of = optional_integer(body, "best_of", 1, MAX_CHOICES)
    if best_of is not None and best_of != n:
        raise invalid("best_of", "best_of must equal n (server-side ranking is not supported)")
    return _request(RequestKind.COMPLETION, body, settings, prompts, n, logprobs, echo)


def parse_chat_request(body: Any, settings: Settings) -> OpenAIRequest:
    body = _object(body, CHAT_FIELDS)
    model = parse_model(body, settings)
    messages = parse_messages(body.get("messages"))
    for name in ("tools", "tool_choice"):
        if body.get(name) not in (None, [], "none"):
            raise invalid(name, f"{name} (function calling) is not supported")
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise invalid("response_format", "only response_format {'type': 'text'} is supported")
    logprobs = None
    if boolean(body, "logprobs", False):
        logprobs = optional_integer(body, "top_logprobs", 0, MAX_CHAT_TOP_LOGPROBS) or 0
    elif body.get("top_logprobs") is not None:
        raise invalid("top_logprobs", "top_logprobs requires logprobs: true")
    if body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    prompt = render_chat(messages, settings.model(model).chat_template)
    n = optional_integer(body, "n", 1, MAX_CHOICES) or 1
    return _request(RequestKind.CHAT, body, settings, (prompt,), n, logprobs, echo=False)


def _request(
    kind: RequestKind,
    body: dict[str, Any],
    settings: Settings,
    prompts: tuple[str, ...],
    n: int,
    logprobs: int | None,
    echo: bool,
) -> OpenAIRequest:
    model = parse_model(body, settings)
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise invalid(name, f"{name} is not supported (use repetition_penalty)")
    if body.get("logit_bias") not in (None, {}):
        raise invalid("logit_bias", "logit_bias is not supported")
    params = parse_sampling(body, settings)
    stream = boolean(body, "stream", False)
    return OpenAIRequest(
        kind=kind,
        model=model,
        prompts=prompts,
        n=n,
        params=params,
        stream=stream,
        include_usage=_include_usage(body.get("stream_options"), stream),
        logprobs=logprobs,
        echo=echo,
    )


def _object(body: Any, allowed: frozenset[str] | set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid("body", "request body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise invalid(unknown[0], f"unknown or unsupported field {unknown[0]!r}")
    return body


def _prompts(raw: Any) -> tuple[str, ...]:
    if raw is None:
        raise invalid("prompt", "prompt is required")
    prompts = [raw] if isinstance(raw, str) else raw
    if not isinstance(prompts, list) or not prompts:
        raise invalid("prompt", "prompt must be a string or a non-empty list of strings")
    if not all(isinstance(p, str) for p in prompts):
        raise invalid("prompt", "prompt must be text (token-id prompts are not supported)")
    if len(prompts) > MAX_PROMPTS:
        raise invalid("prompt", f"at most {MAX_PROMPTS} prompts per request")
    for prompt in prompts:
        require_encodable(prompt, "prompt")
    return tuple(prompts)


def _include_usage(options: Any, stream: bool) -> bool:
    if options is None:
        return False
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
        raise invalid("stream_options", "stream_options accepts include_usage only")
    if not stream:
        raise invalid("stream_options", "stream_options is only allowed with stream: true")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise invalid("stream_options.include_usage", "include_usage must be true or false")
    return include
