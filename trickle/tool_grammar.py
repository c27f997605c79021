"""Grammars for tool calls: forced ones (``tool_choice`` required or a named function), and
``strict`` tools under ``auto``.

A forced answer must be text the model's tool-call parser (``web.common.tools``) reads as
calls, each naming one of the offered functions, with arguments its ``parameters`` schema
accepts:

- ``hermes``: ``<tool_call>{"name":"f","arguments":{...}}</tool_call>``, one newline allowed
  inside the tags (templates write one there), between calls and, when several are allowed,
  after the last: a newline then commits the model to nothing, so one that ends its line
  before its end token (as SmolLM2 does) is not steered into a call it never meant (the engine
  ends an answer whose grammar may end where the model writes past it);
- ``json``: the call object alone, or (more than one call allowed) a JSON list of them.

Under ``auto`` the answer may be text, and the grammar is lazy (llguidance's lazy lexemes):
any text until the model writes ``<tool_call>``, then a call as above, then text again (and
more calls, unless one is the most). With the json parser an answer that starts with ``{`` or
``[`` is a call, any other is text. A tool that is not ``strict`` among strict ones gets its
schema where it can be enforced and any object where not: only the names are held to the
offered ones.

Each call object is written in one order, name first: the hermes parser streams the name as
soon as it is complete. Each function's arguments are a ``%json`` rule of their own, so a
schema's ``$ref`` pointers resolve against that schema, as the client wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from llguidance import LLMatcher

from trickle.grammar import (
    CACHE_SIZE,
    GrammarError,
    check_grammar,
    lark_json,
    schema_grammar,
    schema_text,
)

Parser = Literal["hermes", "json"]


@dataclass(frozen=True)
class ToolSchema:
    """One function a call may name: ``field`` is where the request put its schema."""

    name: str
    parameters: dict[str, Any] | None
    field: str
    strict: bool = True  # False: a schema that cannot be enforced gives way to any object


def tool_call_grammar(tools: Sequence[ToolSchema], parser: Parser, max_calls: int | None) -> str:
    """Calls to any of ``tools`` (one for a named choice), exactly one when ``max_calls`` is 1,
    otherwise one or more, as ``parser`` reads them."""
    if not tools:
        raise GrammarError("tools", None, "a forced tool call needs at least one tool")
    keyed = tuple(_keyed(tool) for tool in tools)
    return _grammar(keyed, parser, max_calls == 1)


def auto_tool_grammar(tools: Sequence[ToolSchema], parser: Parser, max_calls: int | None) -> str:
    """Text, or calls to any of ``tools`` (at most one when ``max_calls`` is 1) wherever the
    model opens one, as ``parser`` reads them."""
    keyed = tuple(_keyed(tool) for tool in tools)
    return _auto_grammar(keyed, parser, max_calls == 1)


_Keyed = tuple[tuple[str, str, str], ...]


def _keyed(tool: ToolSchema) -> tuple[str, str, str]:
    """(name, arguments schema text, field), checked; a tool that is not strict gets any object
    where its own schema cannot be enforced."""
    try:
        text = schema_text(arguments_schema(tool), tool.field)
        if not tool.strict:
            schema_grammar(text, tool.field)
    except GrammarError:
        if tool.strict:
            raise
        text = ANY_OBJECT
    return tool.name, text, tool.field


def arguments_schema(tool: ToolSchema) -> dict[str, Any]:
    """The schema of the call's ``arguments``: an object, as both parsers need (a schema that
    says no ``type`` gets ``object``)."""
    if tool.parameters is not None and not isinstance(tool.parameters, dict):
        raise GrammarError(tool.field, None, f"{tool.field} must be a JSON Schema object")
    schema = {"type": "object"} if tool.parameters is None else dict(tool.parameters)
    kind = schema.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise GrammarError(
            tool.field, "type", f"{tool.field} must describe an object (type 'object')"
        )
    return {**schema, "type": "object"}


ANY_OBJECT = '{"type":"object"}'
# Hermes: what follows the opening tag, up to the closing one.
_HERMES_CALL = '"\\n"? body "\\n"? "</tool_call>"'
# Json: a list of calls, when more than one is allowed.
_CALL_LIST = '"[" body ("," body)* "]"'


@lru_cache(maxsize=CACHE_SIZE)
def _grammar(tools: _Keyed, parser: Parser, single: bool) -> str:
    if parser == "hermes":
        call = f'call: "<tool_call>" {_HERMES_CALL}'
        start = "start: call" if single else 'start: call ("\\n"? call)* "\\n"?'
        lines = [start, call]
    else:
        lines = ["start: body" if single else f"start: body | {_CALL_LIST}"]
    return _compiled([*lines, *_call_rules(tools)])


@lru_cache(maxsize=CACHE_SIZE)
def _auto_grammar(tools: _Keyed, parser: Parser, single: bool) -> str:
    if parser == "hermes":
        # A call's opening tag ends the lazy text before it; the text after the last call
        # (or an answer with none) is free.
        lines = [
            "start: call? TEXT" if single else "start: call* TEXT",
            f"call: call_head {_HERMES_CALL}",
            'call_head[lazy]: TEXT "<tool_call>"',
            "TEXT: /(.|\\n)*/",
        ]
    else:
        # The json parser reads an answer whose first visible character is { or [ as calls.
        calls = "body" if single else f"body | {_CALL_LIST}"
        lines = [
            f"start: PLAIN | SPACE? ({calls})",
            "PLAIN: /\\s*([^\\s{\\[](.|\\n)*)?/",
            "SPACE: /\\s+/",
        ]
    return _compiled(["%llguidance {}", *lines, *_call_rules(tools)])


def _call_rules(tools: _Keyed) -> list[str]:
    """``body``: a call object to one of ``tools``, name first, arguments as their schema."""
    rules = []
    for index, (name, schema, field) in enumerate(tools):
        schema_grammar(schema, field)  # its own errors name its field
        head = json.dumps(f'{{"name":{json.dumps(name)},"arguments":')
        rules.append(f'fn_{index}: {head} args_{index} "}}"')
        rules.append(f"args_{index}: %json {lark_json(schema)}")
    body = "body: " + " | ".join(f"fn_{index}" for index in range(len(tools)))
    return [body, *rules]


def _compiled(lines: list[str]) -> str:
    grammar = LLMatcher.grammar_from_lark("\n".join(lines))
    check_grammar(grammar, "tools")
    return grammar
