"""The tool-call parsers by the names ``[models.<name>] tool_call_parser`` takes."""

from __future__ import annotations

from web.common.tools.hermes import HermesParser
from web.common.tools.json_calls import JsonParser
from web.common.tools.parser import ToolCallParser

PARSER_NAMES = ("hermes", "json")


def make_parser(name: str, max_calls: int | None = None) -> ToolCallParser:
    """A fresh parser for one answer; ``max_calls`` 1 when ``parallel_tool_calls`` is false
    (later calls are dropped, as OpenAI never returns them then)."""
    if name == "hermes":
        return HermesParser(max_calls)
    if name == "json":
        return JsonParser(max_calls)
    raise ValueError(f"unknown tool_call_parser {name!r}; known: {', '.join(PARSER_NAMES)}")
