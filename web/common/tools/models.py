"""The wire shapes of function calling, as pydantic models: chat's ``tools`` and
``tool_choice``, the assistant's ``tool_calls`` and the ``tool`` messages sent back, and the
Responses API's flat function tools and ``function_call`` / ``function_call_output`` items.

A tool's ``strict: true`` promises arguments that match the schema: kept by constrained decoding
wherever a call can happen (docs/structured-output.md).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

TOOL_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
MAX_TOOLS = 128

ToolName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


def _only_a_boolean(value: Any) -> Any:
    """``0`` equals ``False`` to a ``Literal``; JSON's 0 is no boolean."""
    if value is not None and not isinstance(value, bool):
        raise ValueError("strict must be a boolean")
    return value


Strict = Annotated[
    bool | None,
    BeforeValidator(_only_a_boolean),
    Field(
        description="true: the arguments of every call to it match parameters (constrained "
        "decoding, under any tool_choice)"
    ),
]


class FunctionDefinition(BaseModel):
    model_config = TOOL_STRICT

    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Strict = None


class ChatTool(BaseModel):
    """``{"type": "function", "function": {...}}``."""

    model_config = TOOL_STRICT

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = TOOL_STRICT

    name: str


class ChatNamedToolChoice(BaseModel):
    model_config = TOOL_STRICT

    type: Literal["function"]
    function: FunctionName


ChatToolChoice = Literal["none", "auto", "required"] | ChatNamedToolChoice
ChatTools = Annotated[list[ChatTool], Field(max_length=MAX_TOOLS)]


class CalledFunction(BaseModel):
    model_config = TOOL_STRICT

    name: str
    arguments: str


class ChatToolCall(BaseModel):
    """An assistant message's earlier call, as the client sends it back."""

    model_config = TOOL_STRICT

    id: str
    type: Literal["function"]
    function: CalledFunction


class FunctionTool(BaseModel):
    """The Responses API's function tool: the definition's fields at the top level."""

    model_config = TOOL_STRICT

    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Strict = None


class ResponsesNamedToolChoice(BaseModel):
    model_config = TOOL_STRICT

    type: Literal["function"]
    name: str


ResponsesToolChoice = Literal["none", "auto", "required"] | ResponsesNamedToolChoice
ResponsesTools = Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)]
ToolItemStatus = Literal["in_progress", "completed", "incomplete"]


class FunctionCallItem(BaseModel):
    """A ``function_call`` the model made, sent back as input."""

    model_config = TOOL_STRICT

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ToolItemStatus | None = None


class FunctionCallOutputItem(BaseModel):
    """A function's result: ``output`` answers the call named by ``call_id``."""

    model_config = TOOL_STRICT

    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: ToolItemStatus | None = None
