"""A request's tools checked and reduced to what generation and parsing need (``ToolUse``).

What the schema cannot say is checked here, each refusal naming its field: duplicate names,
a ``tool_choice`` naming an absent tool. A forced call (``required`` or a named function) gets
the grammar that constrained decoding enforces (``trickle.tool_grammar``), and so does an
``auto`` answer among whose tools one is ``strict``: text, or calls held to the tools from the
moment the model opens one. A strict schema it cannot enforce is a 400 naming the tool's
schema. Under ``none`` no call can happen, so ``strict`` asks nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from trickle.grammar import GrammarError
from trickle.tool_grammar import Parser, ToolSchema, auto_tool_grammar, tool_call_grammar
from web.common.errors import invalid
from web.common.structured import AnyFormat, format_grammar, grammar_refused
from web.common.tools.calls import ParsedAnswer, parse_answer
from web.common.tools.models import (
    ChatNamedToolChoice,
    ChatTool,
    FunctionTool,
    ResponsesNamedToolChoice,
)
from web.common.tools.parser import ToolCallParser
from web.common.tools.registry import make_parser
from web.common.unchecked_formats import note_unchecked_formats

Choice = Literal["none", "auto", "required"] | dict[str, str]


@dataclass(frozen=True)
class ToolFields:
    """Where a route's request puts a tool's name and schema (``{}``: its index)."""

    name: str
    schema: str


CHAT_FIELDS = ToolFields("tools[{}].function.name", "tools[{}].function.parameters")
RESPONSES_FIELDS = ToolFields("tools[{}].name", "tools[{}].parameters")


@dataclass(frozen=True)
class ToolUse:
    """The tools of one request: their definitions as templates read them, and how the answer
    is parsed (``parser`` None: ``tool_choice`` none, the answer is text). A forced call
    (``required`` or a named function) has the ``grammar`` the engine enforces, and so has an
    ``auto`` answer with a strict tool (``forced`` False: it may be text)."""

    definitions: tuple[dict[str, Any], ...]
    parser: str | None
    max_calls: int | None  # 1 with parallel_tool_calls false
    grammar: str | None = None
    choice: Choice = "auto"  # as a response echoes it
    forced: bool = False  # the answer is calls (required or a named function)

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
    return tool_use(definitions, names, CHAT_FIELDS, choice, named, parallel, parser)


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
    return tool_use(definitions, names, RESPONSES_FIELDS, choice, named, parallel, parser)


def tool_use(
    definitions: list[dict[str, Any]],
    names: list[str],
    fields: ToolFields,
    choice: object,
    named: str | None,
    parallel: bool | None,
    parser: str,
) -> ToolUse | None:
    """Every route's tools, once reduced to function definitions (``parameters`` for the
    schema) and their names; ``named`` is the function a choice names. ``required`` and a
    named function force calls: a grammar that only such calls match, arguments included."""
    for index, name in enumerate(names):
        if name in names[:index]:
            raise invalid(fields.name.format(index), f"tool name {name!r} is used twice")
    if named is not None and named not in names:
        raise invalid("tool_choice", f"tool_choice names {named!r}, which is not in tools")
    forced = named is not None or choice == "required"
    if forced and not definitions:
        raise invalid("tool_choice", "tool_choice forces a tool call, but there are no tools")
    if not definitions:
        return None  # "none" and "auto" without tools choose nothing
    # The definitions as Hugging Face templates take them ({"type": "function", "function"}).
    functions = tuple({"type": "function", "function": d} for d in definitions)
    max_calls = 1 if parallel is False else None
    if choice == "none" and not forced:
        return ToolUse(functions, None, max_calls, choice="none")
    strict = [bool(d.get("strict")) for d in definitions]
    if not forced and not any(strict):
        return ToolUse(functions, parser, max_calls)  # parsed, not constrained
    chosen = [index for index, name in enumerate(names) if named in (None, name)]
    schemas = [
        ToolSchema(
            names[i], definitions[i].get("parameters"), fields.schema.format(i), forced or strict[i]
        )
        for i in chosen
    ]
    try:
        make = tool_call_grammar if forced else auto_tool_grammar
        grammar = make(schemas, _parser_name(parser), max_calls)
    except GrammarError as exc:
        raise grammar_refused(exc) from None
    for schema in schemas:
        note_unchecked_formats(schema.parameters)
    if not forced:
        return ToolUse(functions, parser, max_calls, grammar)
    echo: Choice = "required" if named is None else {"type": "function", "name": named}
    return ToolUse(functions, parser, max_calls, grammar, echo, forced=True)


def answer_grammar(fmt: AnyFormat | None, field: str, tools: ToolUse | None) -> str | None:
    """What the answer must match: the forced call's grammar, or the format's (``field``:
    ``response_format`` or ``text.format``; it leaves no room for the calls ``auto`` allows),
    or strict tools' under ``auto``."""
    grammar = format_grammar(fmt, field)
    forced = tools.grammar if tools is not None and tools.forced else None
    if forced is not None and grammar is not None:
        raise invalid(
            field,
            f"{field} cannot be combined with a forced tool call (tool_choice 'required' or a "
            "named function): the answer is the call",
        )
    return forced or grammar or (tools.grammar if tools is not None else None)


def _parser_name(parser: str) -> Parser:
    if parser == "hermes":
        return "hermes"
    if parser == "json":
        return "json"
    raise ValueError(f"no tool-call grammar for parser {parser!r}")


def choice_name(tool_use: ToolUse | None) -> Choice:
    """The ``tool_choice`` a response echoes."""
    return "none" if tool_use is None else tool_use.choice
