"""The request bodies as pydantic models: the one source of validation and of the OpenAPI schemas.

Static bounds live on the fields. Bounds that come from configuration (the ``max_tokens`` ceiling,
stop-sequence limits, the served models) are bound per ``Settings`` by ``RequestModels``, which
subclasses each model with those limits, so the document served at ``/openapi.json`` is generated
from exactly the classes that validate requests. Every model forbids unknown fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    create_model,
)

from trickle.config.settings import Settings
from trickle.params import (
    MAX_REPETITION_PENALTY,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    MIN_TOP_P,
)
from web.common.format_models import ResponseFormat, TextFormat
from web.common.tools.models import (
    ChatToolCall,
    ChatToolChoice,
    ChatTools,
    FunctionCallItem,
    FunctionCallOutputItem,
    ResponsesToolChoice,
    ResponsesTools,
)

MAX_SEED = 2**63 - 1
MAX_CHOICES = 8
MAX_PROMPTS = 16
# The engine reports the sampled token's log-probability, not the alternatives it passed over:
# more than one entry per position would be a shorter list than asked for, so it is refused.
MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20
MAX_STOP_TOKEN_IDS = 64
MAX_TOKEN_ID = 2**31 - 1
MAX_CACHE_SALT_CHARS = 256
# Placeholders until bound to a configuration (RequestModels); never used to validate a request.
UNBOUND_MAX_TOKENS = 2**31 - 1

STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


def _one_or_many(value: Any) -> Any:
    """``"x"`` is shorthand for ``["x"]`` (OpenAI's ``stop`` and ``prompt``)."""
    return [value] if isinstance(value, str) else value


# pydantic refuses lone surrogates (\\ud800), which JSON can smuggle but are not text.
PromptText = str


def stop_field(max_count: int, max_chars: int) -> Any:
    """``stop``: a string or a list of strings, each non-empty and bounded."""
    item = Annotated[str, Field(min_length=1, max_length=max_chars)]
    items = Annotated[list[item], Field(max_length=max_count)]
    return Annotated[
        items | None,
        BeforeValidator(_one_or_many, json_schema_input_type=item | items | None),
    ]


def model_field(served: Iterable[str]) -> Any:
    """``model``, bound: the schema lists the ``served`` models (an unserved one is a 404)."""
    description = "a served model; the default one when absent"
    extra: dict[str, Any] = {"enum": [*sorted(served), None]}
    return (str | None, Field(None, description=description, json_schema_extra=extra))


def max_tokens_field(ceiling: int) -> Any:
    return Annotated[int | None, Field(ge=1, le=ceiling)]


class SamplingFields(BaseModel):
    """Fields shared by the job API and the OpenAI-compatible API (vLLM's extras included)."""

    model_config = STRICT

    model: str | None = Field(None, description="a served model; the default one when absent")
    max_tokens: max_tokens_field(UNBOUND_MAX_TOKENS) = None  # type: ignore[valid-type]
    temperature: Annotated[float | None, Field(ge=0.0, le=MAX_TEMPERATURE)] = None
    top_k: Annotated[int | None, Field(ge=0, le=MAX_TOP_K)] = None
    top_p: Annotated[float | None, Field(ge=MIN_TOP_P, le=1.0)] = None
    stop: stop_field(UNBOUND_MAX_TOKENS, UNBOUND_MAX_TOKENS) = None  # type: ignore[valid-type]
    seed: Annotated[int | None, Field(ge=0, le=MAX_SEED)] = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[
        int | None, Field(ge=0, le=UNBOUND_MAX_TOKENS, description="no end token before this")
    ] = None
    repetition_penalty: Annotated[
        float | None, Field(ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY)
    ] = None
    stop_token_ids: Annotated[
        list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]] | None,
        Field(max_length=MAX_STOP_TOKEN_IDS, description="vLLM: token ids that end the output"),
    ] = None
    cache_salt: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=MAX_CACHE_SALT_CHARS,
            description=(
                "vLLM: cached prompt prefixes are shared only with requests of the same salt; "
                "absent: only with requests of the same API key"
            ),
        ),
    ] = None


class JobRequest(SamplingFields):
    """``POST /v1/jobs``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"prompt": "The socket module", "max_tokens": 32},
                {"prompt": "Once", "temperature": 0.7, "top_p": 0.9, "stop": ["\n\n"], "seed": 1},
            ]
        }
    )

    prompt: PromptText
    webhook_url: str | None = Field(
        None, description="POST the finished job here (its host must be allowlisted)"
    )
    deadline: float | None = Field(
        None,
        gt=0,
        description=(
            "unix time (s): a job not started by then is not run (status expired); one "
            "still running then is stopped with what it made (finish_reason deadline). "
            "The Cancel-After header does the same with a duration"
        ),
    )


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = Field(
        None, description="vLLM: a usage object in every chunk"
    )
    include_obfuscation: bool | None = Field(None, description="accepted; Trickle never pads")


class OpenAIFields(SamplingFields):
    """Fields of both OpenAI-compatible requests. Accepted only with the values Trickle honours."""

    n: Annotated[int | None, Field(ge=1, le=MAX_CHOICES)] = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="accepted, not used")
    metadata: dict[str, str] | None = Field(None, description="accepted, not used")
    store: bool | None = Field(None, description="accepted, not used")
    service_tier: str | None = Field(None, description="accepted, not used")
    frequency_penalty: Annotated[float | None, Field(ge=0.0, le=0.0)] = Field(
        None, description="only 0: use repetition_penalty"
    )
    presence_penalty: Annotated[float | None, Field(ge=0.0, le=0.0)] = Field(
        None, description="only 0: use repetition_penalty"
    )
    logit_bias: Annotated[dict[str, float] | None, Field(max_length=0)] = Field(
        None, description="only an empty object"
    )


Prompts = Annotated[list[PromptText], Field(min_length=1, max_length=MAX_PROMPTS)]


class CompletionRequest(OpenAIFields):
    """``POST /v1/completions``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"prompt": "The socket module", "max_tokens": 16},
                {"prompt": ["A", "B"], "n": 2, "stream": True, "ignore_eos": True, "max_tokens": 8},
            ]
        }
    )

    prompt: Annotated[
        Prompts, BeforeValidator(_one_or_many, json_schema_input_type=PromptText | Prompts)
    ]
    suffix: Literal[""] | None = Field(None, description="only empty")
    best_of: Annotated[int | None, Field(ge=1, le=MAX_CHOICES)] = Field(
        None, description="must equal n (no server-side ranking)"
    )
    logprobs: Annotated[int | None, Field(ge=0, le=MAX_COMPLETION_LOGPROBS)] = None
    echo: bool | None = None
    response_format: ResponseFormat | None = None


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: PromptText


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: PromptText | list[TextPart] | None = Field(None, description="null only for assistant")
    name: str | None = None
    tool_calls: list[ChatToolCall] | None = Field(None, description="only for assistant")
    tool_call_id: str | None = Field(None, description="the call a tool message answers")


class ChatCompletionRequest(OpenAIFields):
    """``POST /v1/chat/completions``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16},
                {
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_completion_tokens": 8,
                    "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                    "min_tokens": 2,
                },
            ]
        }
    )

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: max_tokens_field(UNBOUND_MAX_TOKENS) = None  # type: ignore[valid-type]
    logprobs: bool | None = None
    top_logprobs: Annotated[int | None, Field(ge=0, le=MAX_CHAT_TOP_LOGPROBS)] = None
    response_format: ResponseFormat | None = None
    tools: ChatTools | None = Field(None, description="function tools")
    tool_choice: ChatToolChoice | None = Field(
        None, description="none, auto, required or a named function (docs/structured-output.md)"
    )
    parallel_tool_calls: bool | None = None


MAX_METADATA_PAIRS = 16


class InputText(BaseModel):
    model_config = STRICT

    type: Literal["input_text", "output_text"]
    text: PromptText
    annotations: list[Any] | None = Field(None, description="accepted on output_text, ignored")
    logprobs: list[Any] | None = Field(None, description="accepted on output_text, ignored")


class InputMessage(BaseModel):
    """A message item; an assistant message may carry the id and status of an output item."""

    model_config = STRICT

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: PromptText | list[InputText]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


def _item_type(value: Any) -> str:
    """An input item's kind: its ``type``, a message when absent (errors then name the
    fields of the kind that was meant, not those of every kind)."""
    if isinstance(value, dict):
        kind = value.get("type")
        return kind if isinstance(kind, str) else "message"
    return str(getattr(value, "type", None) or "message")


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]


class TextConfig(BaseModel):
    model_config = STRICT

    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = Field(None, description="only medium")


class ResponseStreamOptions(BaseModel):
    model_config = STRICT

    include_obfuscation: bool | None = Field(None, description="accepted; Trickle never pads")


class ResponseCreateRequest(SamplingFields):
    """``POST /v1/responses`` (vLLM's sampling extras included; ``max_output_tokens``, not
    ``max_tokens``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"input": "The socket module", "max_output_tokens": 16},
                {
                    "instructions": "Answer briefly.",
                    "input": [{"role": "user", "content": "Hello"}],
                    "background": True,
                    "stream": True,
                },
            ]
        }
    )

    max_tokens: None = Field(None, description="use max_output_tokens")
    input: PromptText | Annotated[list[InputItem], Field(min_length=1)]
    instructions: PromptText | None = None
    max_output_tokens: max_tokens_field(UNBOUND_MAX_TOKENS) = None  # type: ignore[valid-type]
    stream: bool | None = None
    stream_options: ResponseStreamOptions | None = None
    background: bool | None = None
    store: bool | None = None
    metadata: Annotated[
        dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None,
        Field(max_length=MAX_METADATA_PAIRS),
    ] = None
    previous_response_id: str | None = None
    include: list[Literal["message.output_text.logprobs"]] | None = None
    top_logprobs: Annotated[int | None, Field(ge=0, le=MAX_CHAT_TOP_LOGPROBS)] = None
    parallel_tool_calls: bool | None = None
    tools: ResponsesTools | None = Field(None, description="function tools")
    tool_choice: ResponsesToolChoice | None = Field(
        None, description="none, auto, required or a named function (docs/structured-output.md)"
    )
    text: TextConfig | None = None
    reasoning: None = Field(None, description="not supported")
    truncation: Literal["disabled"] | None = None
    user: str | None = Field(None, description="accepted, not used")
    safety_identifier: str | None = Field(None, description="accepted, not used")
    prompt_cache_key: str | None = Field(None, description="accepted, not used")
    service_tier: str | None = Field(None, description="accepted, not used")


@dataclass(frozen=True)
class RequestModels:
    """The request models bound to one configuration's limits and models."""

    job: type[JobRequest]
    completion: type[CompletionRequest]
    chat: type[ChatCompletionRequest]
    responses: type[ResponseCreateRequest]

    @classmethod
    def bound_to(cls, settings: Settings) -> RequestModels:
        limits = settings.limits
        ceiling = max_tokens_field(limits.max_tokens_ceiling)
        bounds: dict[str, Any] = {
            "model": model_field(settings.models),
            "max_tokens": (ceiling, None),
            "min_tokens": (
                Annotated[int | None, Field(ge=0, le=limits.max_tokens_ceiling)],
                Field(None, description="no end token before this many tokens"),
            ),
            "stop": (stop_field(limits.max_stop_sequences, limits.max_stop_chars), None),
        }

        def bind(base: type[Any], **extra: Any) -> Any:
            fields = {**bounds, **extra}
            return create_model(base.__name__, __base__=base, __module__=__name__, **fields)

        return cls(
            job=bind(JobRequest),
            completion=bind(CompletionRequest),
            chat=bind(ChatCompletionRequest, max_completion_tokens=(ceiling, None)),
            responses=bind(
                ResponseCreateRequest,
                max_tokens=(None, Field(None, description="max_output_tokens")),
                max_output_tokens=(ceiling, None),
            ),
        )

    def all(self) -> tuple[type[BaseModel], ...]:
        return (self.job, self.completion, self.chat, self.responses)
