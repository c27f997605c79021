"""A request's tools checked and reduced to what generation and parsing need (``ToolUse``).

What the schema cannot say is checked here, each refusal naming its field: duplicate names,
a ``tool_choice`` naming an absent tool, and the choices only constrained decoding can keep
(``required`` and a named function), which are refused rather than silently not enforced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from web.errors import invalid
from web.tools.calls import ParsedAnswer, parse_answer
from web.tools.models import (
    ChatNamedToolChoice,
    ChatTool,
    FunctionTool,
    ResponsesNamedToolChoice,
)
from web.tools.parser import ToolCallParser
from web.tools.registry import make_parser

Choice = Literal["none", "auto"]
CONSTRAINED = "needs constrained decoding, which is not supported yet: use 'auto'"


@dataclass(frozen=True)
class ToolUse:
    """The tools of one request: their definitions as templates read them, and how the answer
    is parsed (``parser`` None: ``tool_choice`` none, the answer is text)."""

    definitions: tuple[dict[str, Any], ...]
    parser: str | None
    max_calls: int | None  # 1 with parallel_tool_calls false

    def new_parser(self) -> ToolCallParser | None:
        return None if self.parser is None else make_parser(self.parser, self.max_calls)

    def parse(self, text: str, finished: bool = True) -> ParsedAnswer | None:
        parser = self.new_parser()
        return None if parser is None else parse_answer(parser, text, finished)


def chat_tools(
    tools: Sequence[ChatTool] | None,
    choice: str | ChatNamedToolChoice | None,
    parallel: bool | None,
    parser: str,
) -> ToolUse | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat request."""
    named = choice.function.name if isinstance(choice, ChatNamedToolChoice) else None
    definitions = [tool.function.model_dump(exclude_none=True) for tool in tools or ()]
    names = [tool.function.name for tool in tools or ()]
    return tool_use(definitions, names, "tools[{}].function.name", choice, named, parallel, parser)


def responses_tools(
    tools: Sequence[FunctionTool] | None,
    choice: str | ResponsesNamedToolChoice | None,
    parallel: bool | None,
    parser: str,
) -> ToolUse | None:
    """The same for the Responses API's flat function tools."""
    named = choice.name if isinstance(choice, ResponsesNamedToolChoice) else None
    definitions = [tool.model_dump(exclude_none=True, exclude={"type"}) for tool in tools or ()]
    names = [tool.name for tool in tools or ()]
    return tool_use(definitions, names, "tools[{}].name", choice, named, parallel, parser)


def tool_use(
    definitions: list[dict[str, Any]],
    names: list[str],
    name_param: str,
    choice: object,
    named: str | None,
    parallel: bool | None,
    parser: str,
) -> ToolUse | None:
    """Every route's tools, once reduced to function definitions (``parameters`` for the
    schema) and their names: ``name_param`` formats the field a duplicate name is refused on,
    ``named`` is the function a choice names."""
    for index, name in enumerate(names):
        if name in names[:index]:
            raise invalid(name_param.format(index), f"tool name {name!r} is used twice")
    if named is not None:
        if named not in names:
            raise invalid("tool_choice", f"tool_choice names {named!r}, which is not in tools")
        raise invalid("tool_choice", f"a named function in tool_choice {CONSTRAINED}")
    if choice == "required":
        raise invalid("tool_choice", f"tool_choice 'required' {CONSTRAINED}")
    if not definitions:
        return None  # "none" and "auto" without tools choose nothing
    # The definitions as Hugging Face templates take them ({"type": "function", "function"}).
    functions = tuple({"type": "function", "function": d} for d in definitions)
    max_calls = 1 if parallel is False else None
    return ToolUse(functions, None if choice == "none" else parser, max_calls)


def choice_name(tool_use: ToolUse | None) -> Choice:
    """The ``tool_choice`` a response echoes."""
    return "none" if tool_use is None or tool_use.parser is None else "auto"
