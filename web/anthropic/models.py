"""The Messages API's bodies as pydantic models and its answers as typed dictionaries: the one
source of their validation and of their OpenAPI schemas (``web.api_schema``).

Bounds that come from configuration (the ``max_tokens`` ceiling, the stop-sequence limits, the
served models) are bound per configuration by ``messages_models``, as ``RequestModels`` binds the
OpenAI bodies' (and cached, so a request pays for the binding once per process).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model
from typing_extensions import TypedDict

from trickle.config.settings import Settings
from trickle.params import MAX_TOP_K, MIN_TOP_P
from web.common.request_models import (
    STRICT,
    UNBOUND_MAX_TOKENS,
    PromptText,
    max_tokens_field,
    model_field,
)
from web.common.tools.models import MAX_TOOLS, Strict, ToolName

# Anthropic's temperature range (OpenAI's goes to 2).
MAX_ANTHROPIC_TEMPERATURE = 1.0
MAX_USER_ID_CHARS = 256
# anthropic-version is a date (the SDKs send the one they were built for: 2023-06-01 for years,
# later ones since); every version's Messages API is served the same, but a value that is no
# date is refused by name.
VERSION_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"


def stop_sequences_field(max_count: int, max_chars: int) -> Any:
    item = Annotated[str, Field(min_length=1, max_length=max_chars)]
    return Annotated[list[item] | None, Field(max_length=max_count)]


class AnthropicCacheControl(BaseModel):
    model_config = STRICT

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class AnthropicTextBlock(BaseModel):
    """A text content block (images and documents are not served)."""

    model_config = STRICT

    type: Literal["text"]
    text: PromptText
    cache_control: AnthropicCacheControl | None = Field(None, description="accepted, not used")


class AnthropicToolUseBlock(BaseModel):
    """An assistant's earlier tool call, as the client sends it back."""

    model_config = STRICT

    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: dict[str, Any]
    cache_control: AnthropicCacheControl | None = Field(None, description="accepted, not used")


class AnthropicToolResultBlock(BaseModel):
    """A tool's result, in a user turn: ``tool_use_id`` names the call it answers."""

    model_config = STRICT

    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: PromptText | list[AnthropicTextBlock] | None = None
    is_error: bool | None = Field(None, description="true: the template reads 'Error: ' first")
    cache_control: AnthropicCacheControl | None = Field(None, description="accepted, not used")


AnthropicBlock = Annotated[
    AnthropicTextBlock | AnthropicToolUseBlock | AnthropicToolResultBlock,
    Field(discriminator="type"),
]


class AnthropicMessage(BaseModel):
    model_config = STRICT

    role: Literal["user", "assistant"]
    content: PromptText | list[AnthropicBlock]


class AnthropicMetadata(BaseModel):
    model_config = STRICT

    user_id: Annotated[str | None, Field(max_length=MAX_USER_ID_CHARS)] = Field(
        None, description="accepted, not used"
    )


class AnthropicTool(BaseModel):
    """A client tool: its name, what it does, and the JSON schema of its input. Anthropic's
    server tools (``web_search_...``, ``bash_...``) have another ``type`` and are refused."""

    model_config = STRICT

    name: ToolName
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    strict: Strict = None
    cache_control: AnthropicCacheControl | None = Field(None, description="accepted, not used")


class AnthropicToolChoice(BaseModel):
    """``auto``, ``none``, ``any`` (a call to one of the tools) and ``tool`` (a call to the one
    ``name`` names); the last two are kept by constrained decoding."""

    model_config = STRICT

    type: Literal["auto", "none", "any", "tool"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = Field(None, description="true: at most one call")


class CountTokensRequest(BaseModel):
    """``POST /v1/messages/count_tokens``: the prompt a message with these fields would have."""

    model_config = ConfigDict(
        **STRICT,
        json_schema_extra={
            "examples": [
                {"model": "demo", "messages": [{"role": "user", "content": "Hello"}]},
                {
                    "system": [{"type": "text", "text": "Answer briefly."}],
                    "messages": [
                        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                        {"role": "assistant", "content": "Hello"},
                        {"role": "user", "content": "The socket module"},
                    ],
                },
            ]
        },
    )

    model: str | None = Field(None, description="a served model; the default one when absent")
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: PromptText | list[AnthropicTextBlock] | None = None
    tools: Annotated[list[AnthropicTool] | None, Field(max_length=MAX_TOOLS)] = None
    tool_choice: AnthropicToolChoice | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "demo",
                    "max_tokens": 16,
                    "messages": [{"role": "user", "content": "Hello"}],
                },
                {
                    "max_tokens": 8,
                    "system": "Answer briefly.",
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                    "stop_sequences": ["\n\n"],
                    "temperature": 0.5,
                    "top_k": 40,
                    "metadata": {"user_id": "u-1"},
                    "stream": True,
                },
                {
                    "max_tokens": 32,
                    "tools": [
                        {
                            "name": "get_weather",
                            "description": "The weather in a city",
                            "input_schema": {
                                "type": "object",
                                "properties": {"city": {"type": "string"}},
                            },
                        }
                    ],
                    "tool_choice": {"type": "auto"},
                    "messages": [
                        {"role": "user", "content": "Weather in Paris?"},
                        {
                            "role": "assistant",
                            "content": [
                                {
                                    "type": "tool_use",
                                    "id": "toolu_1",
                                    "name": "get_weather",
                                    "input": {"city": "Paris"},
                                }
                            ],
                        },
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "tool_result",
                                    "tool_use_id": "toolu_1",
                                    "content": "sunny, 22C",
                                }
                            ],
                        },
                    ],
                },
            ]
        }
    )

    max_tokens: max_tokens_field(UNBOUND_MAX_TOKENS)  # type: ignore[valid-type]
    stop_sequences: stop_sequences_field(  # type: ignore[valid-type]
        UNBOUND_MAX_TOKENS, UNBOUND_MAX_TOKENS
    ) = None
    temperature: Annotated[float | None, Field(ge=0.0, le=MAX_ANTHROPIC_TEMPERATURE)] = None
    top_p: Annotated[float | None, Field(ge=MIN_TOP_P, le=1.0)] = None
    top_k: Annotated[int | None, Field(ge=0, le=MAX_TOP_K)] = None
    metadata: AnthropicMetadata | None = None
    stream: bool | None = None
    cache_control: AnthropicCacheControl | None = Field(None, description="accepted, not used")


@dataclass(frozen=True)
class MessagesModels:
    """The two bodies bound to one configuration's limits and models."""

    create: type[MessagesRequest]
    count_tokens: type[CountTokensRequest]

    def all(self) -> tuple[type[BaseModel], ...]:
        return (self.create, self.count_tokens)


def messages_models(settings: Settings) -> MessagesModels:
    limits = settings.limits
    return _bound(
        limits.max_tokens_ceiling,
        limits.max_stop_sequences,
        limits.max_stop_chars,
        tuple(sorted(settings.models)),
    )


@cache
def _bound(ceiling: int, stops: int, stop_chars: int, models: tuple[str, ...]) -> MessagesModels:
    model = model_field(models)
    create = create_model(
        MessagesRequest.__name__,
        __base__=MessagesRequest,
        __module__=__name__,
        model=model,
        max_tokens=(Annotated[int, Field(ge=1, le=ceiling)], ...),
        stop_sequences=(stop_sequences_field(stops, stop_chars), None),
    )
    count = create_model(
        CountTokensRequest.__name__, __base__=CountTokensRequest, __module__=__name__, model=model
    )
    return MessagesModels(create, count)


class AnthropicTextContent(TypedDict):
    type: Literal["text"]
    text: str


class AnthropicUsage(TypedDict):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


class AnthropicToolUseContent(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


AnthropicContent = AnthropicTextContent | AnthropicToolUseContent
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessageObject(TypedDict):
    """The message object, as ``POST /v1/messages`` answers it."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    content: list[AnthropicContent]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: AnthropicUsage


class MessageTokensCount(TypedDict):
    input_tokens: int


class AnthropicErrorDetail(TypedDict):
    type: str
    message: str


class AnthropicError(TypedDict):
    type: Literal["error"]
    error: AnthropicErrorDetail


ANTHROPIC_RESPONSE_MODELS: dict[str, Any] = {
    "Message": MessageObject,
    "MessageTokensCount": MessageTokensCount,
    "AnthropicError": AnthropicError,
}
