"""Forced tool-call grammars: what they match is what the model's tool-call parser reads as
calls to the offered functions, with arguments their schemas accept; a single call when
parallel calls are off; each function's schema checked on its own field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest

from tests.llg_tokenizer import llg_tokenizer, matches
from trickle.grammar import GrammarError
from trickle.tool_grammar import ToolSchema, tool_call_grammar
from web.common.tools.calls import parse_answer
from web.common.tools.registry import make_parser

WEATHER = ToolSchema(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "tools[0].function.parameters",
)
# A pydantic-style schema: $ref pointers into its own $defs, no "type" at the top.
NESTED = ToolSchema(
    "add-item",
    {"properties": {"item": {"$ref": "#/$defs/Item"}}, "$defs": {"Item": {"type": "integer"}}},
    "tools[1].function.parameters",
)
ANY = ToolSchema("ping", None, "tools[2].function.parameters")
TOOLS = [WEATHER, NESTED, ANY]


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> llguidance.LLTokenizer:
    return llg_tokenizer(demo_model_dir / "tokenizer.model")


def call(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))


def hermes(*calls: str, sep: str = "") -> str:
    return sep.join(f"<tool_call>{c}</tool_call>" for c in calls)


def parsed(parser: str, text: str) -> list[tuple[str, Any]]:
    answer = parse_answer(make_parser(parser), text)
    assert answer.content == ""
    return [(c.name, json.loads(c.arguments)) for c in answer.calls]


def test_hermes_calls_match_and_parse_into_valid_calls(tokenizer: llguidance.LLTokenizer) -> None:
    grammar = tool_call_grammar(TOOLS, "hermes", None)
    one = hermes(call("get_weather", {"city": "Paris", "unit": "c"}))
    two = (
        "<tool_call>\n"
        + call("add-item", {"item": 3})
        + "\n</tool_call>\n"
        + hermes(call("ping", {"any": [1]}))
    )
    for text in (one, two):
        assert matches(tokenizer, grammar, text), text
    assert parsed("hermes", two) == [("add-item", {"item": 3}), ("ping", {"any": [1]})]
    for wrong in (
        hermes(call("get_weather", {"town": "Paris"})),  # additionalProperties false
        hermes(call("get_weather", {"city": "Paris", "unit": "k"})),
        hermes(call("add-item", {"item": "3"})),  # the $ref resolved in its own schema
        hermes(call("absent", {})),
        hermes(call("ping", {})) + "and some text",
        "Sure! " + one,
        '<tool_call>{"arguments":{},"name":"ping"}</tool_call>',  # name first, always
        "",
    ):
        assert not matches(tokenizer, grammar, wrong), wrong


def test_without_parallel_calls_exactly_one_call_matches(tokenizer: llguidance.LLTokenizer) -> None:
    grammar = tool_call_grammar(TOOLS, "hermes", 1)
    assert matches(tokenizer, grammar, hermes(call("ping", {})))
    assert not matches(tokenizer, grammar, hermes(call("ping", {}), call("ping", {})))
    json_grammar = tool_call_grammar(TOOLS, "json", 1)
    assert matches(tokenizer, json_grammar, call("ping", {}))
    assert not matches(tokenizer, json_grammar, f"[{call('ping', {})}]")


def test_a_named_function_is_the_only_one_that_matches(tokenizer: llguidance.LLTokenizer) -> None:
    grammar = tool_call_grammar([WEATHER], "hermes", None)
    assert matches(tokenizer, grammar, hermes(call("get_weather", {"city": "Oslo"})))
    assert not matches(tokenizer, grammar, hermes(call("ping", {})))


def test_json_calls_match_and_parse_as_an_object_or_a_list(
    tokenizer: llguidance.LLTokenizer,
) -> None:
    grammar = tool_call_grammar(TOOLS, "json", None)
    single = call("get_weather", {"city": "Rome"})
    listed = f"[{single},{call('add-item', {'item': 1})}]"
    assert matches(tokenizer, grammar, single) and matches(tokenizer, grammar, listed)
    assert parsed("json", listed) == [("get_weather", {"city": "Rome"}), ("add-item", {"item": 1})]
    for wrong in ("[]", f"[{single}", call("get_weather", {}), f"<tool_call>{single}</tool_call>"):
        assert not matches(tokenizer, grammar, wrong), wrong


@pytest.mark.parametrize(
    ("parameters", "keyword"),
    [
        ({"type": "object", "properties": {"a": {"not": {"pattern": "^x"}}}}, "not"),
        ({"type": "string"}, "type"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/gone"}}}, "$ref"),
    ],
)
def test_a_schema_that_cannot_be_enforced_is_refused_on_its_own_field(
    parameters: dict[str, Any], keyword: str
) -> None:
    bad = ToolSchema("bad", parameters, "tools[3].function.parameters")
    with pytest.raises(GrammarError) as raised:
        tool_call_grammar([*TOOLS, bad], "hermes", None)
    assert raised.value.field == "tools[3].function.parameters"
    assert raised.value.keyword == keyword
