"""Grammars for forced tool calls (``tool_choice`` required or a named function).

The answer must be text the model's tool-call parser (``web.common.tools``) reads as calls, each
naming one of the offered functions, with arguments its ``parameters`` schema accepts:

- ``hermes``: ``<tool_call>{"name":"f","arguments":{...}}</tool_call>``, one newline allowed
  inside the tags (templates write one there) and between calls;
- ``json``: the call object alone, or (more than one call allowed) a JSON list of them.

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


def tool_call_grammar(tools: Sequence[ToolSchema], parser: Parser, max_calls: int | None) -> str:
    """Calls to any of ``tools`` (one for a named choice), exactly one when ``max_calls`` is 1,
    otherwise one or more, as ``parser`` reads them."""
    if not tools:
        raise GrammarError("tools", None, "a forced tool call needs at least one tool")
    keyed = tuple(
        (tool.name, schema_text(arguments_schema(tool), tool.field), tool.field) for tool in tools
    )
    return _grammar(keyed, parser, max_calls == 1)


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


@lru_cache(maxsize=CACHE_SIZE)
def _grammar(tools: tuple[tuple[str, str, str], ...], parser: Parser, single: bool) -> str:
    rules = []
    for index, (name, schema, field) in enumerate(tools):
        schema_grammar(schema, field)  # its own errors name its field
        head = json.dumps(f'{{"name":{json.dumps(name)},"arguments":')
        rules.append(f'fn_{index}: {head} args_{index} "}}"')
        rules.append(f"args_{index}: %json {lark_json(schema)}")
    body = "body: " + " | ".join(f"fn_{index}" for index in range(len(tools)))
    if parser == "hermes":
        call = 'call: "<tool_call>" "\\n"? body "\\n"? "</tool_call>"'
        start = "start: call" if single else 'start: call ("\\n"? call)*'
        lark = "\n".join([start, call, body, *rules])
    else:
        start = "start: body" if single else 'start: body | "[" body ("," body)* "]"'
        lark = "\n".join([start, body, *rules])
    grammar = LLMatcher.grammar_from_lark(lark)
    check_grammar(grammar, "tools")
    return grammar
