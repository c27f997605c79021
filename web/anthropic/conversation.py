"""A Messages API conversation as the chat template reads it, tools included: the same turns
the OpenAI routes hand the template, so one template (and one tool-call parser) serves both.

- A turn's text blocks are its text.
- An assistant's ``tool_use`` blocks are its ``tool_calls`` (``input`` as JSON text, which the
  template reads back as a mapping).
- A user's ``tool_result`` blocks are ``tool`` turns answering the call they name, ahead of the
  user's own text (Anthropic puts results first); ``is_error`` reads ``Error: `` before the
  result, since templates know no such flag.

Consecutive user (or assistant) turns are one turn, as Anthropic combines them.
"""

from __future__ import annotations

import json

from web.anthropic.models import (
    AnthropicMessage,
    AnthropicTextBlock,
    AnthropicTool,
    AnthropicToolChoice,
    AnthropicToolResultBlock,
    AnthropicToolUseBlock,
)
from web.common.chat_template import ChatTurn, TurnCall
from web.common.errors import invalid
from web.common.tools.definitions import ToolFields, ToolUse, tool_use

ERROR_PREFIX = "Error: "
TOOL_FIELDS = ToolFields("tools[{}].name", "tools[{}].input_schema")


def message_tools(
    tools: list[AnthropicTool] | None, choice: AnthropicToolChoice | None, parser: str
) -> ToolUse | None:
    """``tools`` and ``tool_choice``: a tool's ``input_schema`` is the function's
    ``parameters``; ``disable_parallel_tool_use`` allows one call. ``any`` forces a call to
    one of the tools, ``tool`` to the one it names (constrained decoding keeps both)."""
    names = [tool.name for tool in tools or ()]
    if choice is not None and choice.type == "tool":
        if choice.name is None:
            raise invalid("tool_choice.name", "a tool_choice of type 'tool' names a tool")
        if choice.name not in names:
            raise invalid(
                "tool_choice.name", f"tool_choice names {choice.name!r}, which is not in tools"
            )
    elif choice is not None and choice.name is not None:
        raise invalid("tool_choice.name", "only a tool_choice of type 'tool' names a tool")
    definitions = [
        {
            "name": tool.name,
            **({"description": tool.description} if tool.description is not None else {}),
            "parameters": tool.input_schema,
            **({"strict": True} if tool.strict else {}),
        }
        for tool in tools or ()
    ]
    kind = "auto" if choice is None else choice.type
    named = choice.name if choice is not None and choice.type == "tool" else None
    parallel = False if choice is not None and choice.disable_parallel_tool_use else None
    choice_kind = "required" if kind == "any" else kind
    return tool_use(definitions, names, TOOL_FIELDS, choice_kind, named, parallel, parser)


def conversation_turns(messages: list[AnthropicMessage], declared: set[str]) -> list[ChatTurn]:
    """The turns, tool results checked against the calls of the assistant turn before them,
    and the calls against the ``declared`` tools (``_check_tool_blocks``)."""
    _check_tool_blocks(messages, declared)
    turns: list[ChatTurn] = []
    called: set[str] = set()  # the ids of the last assistant turn's calls
    for index, message in enumerate(messages):
        if isinstance(message.content, str):
            _append(turns, ChatTurn(message.role, message.content))
            continue
        texts = [b.text for b in message.content if isinstance(b, AnthropicTextBlock)]
        if message.role == "assistant":
            calls = tuple(
                TurnCall(b.id, b.name, json.dumps(b.input, ensure_ascii=False))
                for b in message.content
                if isinstance(b, AnthropicToolUseBlock)
            )
            called = {call.id for call in calls}
            _append(turns, ChatTurn("assistant", "".join(texts), calls))
            continue
        results = [
            (at, b)
            for at, b in enumerate(message.content)
            if isinstance(b, AnthropicToolResultBlock)
        ]
        for at, result in results:
            if result.tool_use_id not in called:
                raise invalid(
                    f"messages[{index}].content[{at}].tool_use_id",
                    f"tool_use_id {result.tool_use_id!r} answers no tool_use block of the "
                    "assistant turn before it",
                )
            turns.append(ChatTurn("tool", _result_text(result), tool_call_id=result.tool_use_id))
        if texts or not results:
            _append(turns, ChatTurn("user", "".join(texts)))
    return turns


def _check_tool_blocks(messages: list[AnthropicMessage], declared: set[str]) -> None:
    """What Anthropic refuses (400 naming the field): an empty ``content`` list anywhere but
    a final assistant turn, a ``tool_use`` id used twice, a ``tool_use`` of a tool the
    request does not declare."""
    seen: set[str] = set()
    last = len(messages) - 1
    for index, message in enumerate(messages):
        if isinstance(message.content, str):
            continue
        if not message.content and not (index == last and message.role == "assistant"):
            raise invalid(
                f"messages[{index}].content",
                f"messages[{index}]: all messages must have non-empty content except for the "
                "optional final assistant message",
            )
        for at, block in enumerate(message.content):
            if not isinstance(block, AnthropicToolUseBlock):
                continue
            where = f"messages[{index}].content[{at}]"
            if block.id in seen:
                raise invalid(f"{where}.id", f"tool_use ids must be unique: {block.id!r} repeats")
            seen.add(block.id)
            if block.name not in declared:
                raise invalid(
                    f"{where}.name",
                    f"tool_use block names tool {block.name!r}, which is not in tools",
                )


def _result_text(result: AnthropicToolResultBlock) -> str:
    content = result.content or ""
    text = content if isinstance(content, str) else "".join(block.text for block in content)
    return ERROR_PREFIX + text if result.is_error else text


def _append(turns: list[ChatTurn], turn: ChatTurn) -> None:
    """A turn of the same role as the last one (not a tool result) joins it."""
    last = turns[-1] if turns else None
    if last is None or last.role != turn.role or turn.role == "tool":
        turns.append(turn)
        return
    content = f"{last.content}\n\n{turn.content}" if last.content and turn.content else ""
    content = content or last.content or turn.content
    turns[-1] = ChatTurn(turn.role, content, last.tool_calls + turn.tool_calls)
