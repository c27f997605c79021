"""The Responses API's bodies as typed dictionaries: its builders return them (mypy checks the
shape) and ``web.api_schema`` generates the ``Response`` schemas from the same types."""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict

from web.common.response_models import Queued


class InputTokensDetails(TypedDict):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class ResponseUsage(TypedDict):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class TopLogprob(TypedDict):
    token: str
    bytes: list[int]
    logprob: float


class OutputLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[OutputLogprob]


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(TypedDict):
    id: str
    type: Literal["message"]
    status: ItemStatus
    role: Literal["assistant"]
    content: list[OutputText]


class OutputFunctionCall(TypedDict):
    id: str
    type: Literal["function_call"]
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class ResponseError(TypedDict):
    code: Literal["server_error"]
    message: str


class IncompleteDetails(TypedDict):
    reason: Literal["max_output_tokens"]


class ReasoningConfig(TypedDict):
    effort: None
    summary: None


class ResponseTextFormat(TypedDict):
    """The request's ``text.format``: ``text``, ``json_object``, or ``json_schema`` with its
    ``name``, ``schema``, ``description`` and ``strict``."""

    type: Literal["text", "json_object", "json_schema"]
    name: NotRequired[str]
    schema: NotRequired[dict[str, Any]]
    description: NotRequired[str]
    strict: NotRequired[bool]


class NamedFunctionChoice(TypedDict):
    type: Literal["function"]
    name: str


ToolChoice = Literal["none", "auto", "required"] | NamedFunctionChoice


class ResponseTextConfig(TypedDict):
    format: ResponseTextFormat
    verbosity: Literal["medium"]


class ResponseObject(TypedDict):
    """A Responses API response, as OpenAI's client parses it (every required field)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: ResponseStatus
    background: bool
    completed_at: int | None
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: None
    metadata: dict[str, str]
    model: str
    output: list[OutputMessage | OutputFunctionCall]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig
    service_tier: Literal["default"]
    store: bool
    temperature: float
    text: ResponseTextConfig
    tool_choice: ToolChoice
    tools: list[Any]
    top_logprobs: int
    top_p: float
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: None
    # While it is queued (background mode): where its job stands.
    queued: NotRequired[Queued]


class ResponseDeleted(TypedDict):
    id: str
    object: Literal["response"]
    deleted: bool


RESPONSES_RESPONSE_MODELS: dict[str, Any] = {
    "Response": ResponseObject,
    "ResponseDeleted": ResponseDeleted,
}
