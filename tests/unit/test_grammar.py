"""The grammar builders against llguidance with the demo model's real vocabulary: every grammar
compiles into a matcher, a valid answer (compact JSON) is matched whole, and a wrong one is not;
a schema the engine could not enforce is a ``GrammarError`` naming its field and keyword."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest

from tests.llg_tokenizer import llg_tokenizer, matches
from trickle.grammar import GrammarError, json_object_grammar, json_schema_grammar
from trickle.grammar_errors import schema_error
from trickle.patterns import anchor_patterns

FIELD = "response_format.json_schema.schema"
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "home": {"$ref": "#/$defs/place"},
    },
    "required": ["name", "age", "home"],
    "additionalProperties": False,
    "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> llguidance.LLTokenizer:
    return llg_tokenizer(demo_model_dir / "tokenizer.model")


def test_a_schema_matches_its_instances_in_compact_json_only(
    tokenizer: llguidance.LLTokenizer,
) -> None:
    grammar = json_schema_grammar(PERSON, FIELD)
    person = {"name": "Ada", "age": 36, "email": "ada@example.org", "home": {"city": "London"}}
    assert matches(tokenizer, grammar, json.dumps(person, separators=(",", ":")))
    assert not matches(tokenizer, grammar, json.dumps(person))  # spaces after , and :
    for wrong in (
        {**person, "age": -1},
        {**person, "name": ""},
        {**person, "extra": 1},
        {"name": "Ada", "age": 36},  # home is required
        {**person, "tags": ["c"]},
        {**person, "home": {"city": 1}},
    ):
        assert not matches(tokenizer, grammar, json.dumps(wrong, separators=(",", ":"))), wrong
    assert not matches(tokenizer, grammar, '{"name":"Ada","age":36')  # unfinished


def test_json_object_matches_any_object_and_nothing_else(
    tokenizer: llguidance.LLTokenizer,
) -> None:
    grammar = json_object_grammar()
    assert matches(tokenizer, grammar, '{"x":[1,2.5,{"y":null}],"z":"\u00e9"}')
    assert matches(tokenizer, grammar, "{}")
    for wrong in ("[1]", '"x"', "{", '{"x":1}}', "{'x':1}"):
        assert not matches(tokenizer, grammar, wrong), wrong


# Keywords llguidance 1.9 enforces (docs/structured-output.md lists them), each with an
# instance and a non-instance.
ENFORCED: list[tuple[dict[str, Any], str, str]] = [
    ({"type": "string", "pattern": "^x+$"}, '"xx"', '"xy"'),
    ({"type": "string", "format": "date"}, '"2024-02-29"', '"Feb 29"'),
    ({"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"', '"u"'),
    ({"type": "integer", "multipleOf": 3}, "9", "10"),
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "0.5", "0"),
    ({"enum": [1, "a", None]}, '"a"', '"b"'),
    ({"const": {"a": 1}}, '{"a":1}', '{"a":2}'),
    ({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, "true", '"x"'),
    ({"oneOf": [{"type": "integer"}, {"type": "null"}]}, "null", "[]"),
    (  # a discriminated union: served as anyOf (trickle/one_of.py)
        {
            "oneOf": [
                {"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                {
                    "type": "object",
                    "properties": {"k": {"const": "b"}, "n": {"type": "integer"}},
                    "required": ["k", "n"],
                },
            ]
        },
        '{"k":"b","n":1}',
        '{"k":"c"}',
    ),
    (  # exactly one of two keys
        {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
        '{"b":1}',
        '{"a":1,"b":1}',
    ),
    ({"allOf": [{"type": "integer"}, {"minimum": 2}]}, "2", "1"),
    ({"type": "array", "minItems": 1, "maxItems": 2}, "[1]", "[]"),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, "[1]", "[1,2]"),
    ({"type": "object", "minProperties": 1}, '{"a":1}', "{}"),
    ({"type": "object", "maxProperties": 1}, '{"a":1}', '{"a":1,"b":2}'),
    (
        {"type": "object", "patternProperties": {"^n": {"type": "integer"}}},
        '{"n1":1}',
        '{"n1":"x"}',
    ),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, '{"a":1}', '{"a":"1"}'),
    ({"type": ["string", "null"]}, "null", "1"),
    # Rewritten exactly (trickle.conditionals).
    # (a required key no property lists comes first: llguidance's order)
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, '{"b":2,"a":1}', '{"a":1}'),
    ({"not": {"type": "string"}}, "1", '"a"'),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, '"ab"', '"a"'),
    # Rewritten exactly (trickle.one_of, trickle.formats, trickle.unique_items).
    ({"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b", "x"]}]}, '"x"', '"b"'),
    ({"type": "integer", "format": "int32"}, "2147483647", "2147483648"),
    ({"type": "string", "format": "byte"}, '"AA=="', '"AA="'),
    ({"type": "string", "format": "uri-reference"}, '"../a?b#c"', '"a b"'),
    ({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, "[true]", "[true,true]"),
]


@pytest.mark.parametrize(("schema", "instance", "other"), ENFORCED)
def test_an_enforced_keyword_accepts_its_instance_and_refuses_another(
    tokenizer: llguidance.LLTokenizer, schema: dict[str, Any], instance: str, other: str
) -> None:
    grammar = json_schema_grammar(schema, FIELD)
    assert matches(tokenizer, grammar, instance)
    assert not matches(tokenizer, grammar, other)


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"not": {"pattern": "^a"}}, "not"),  # no complement without not: a look-ahead
        ({"if": {"minLength": 2}, "then": {"type": "string"}}, "if"),
        ({"type": "array", "contains": {"type": "integer"}}, "contains"),
        ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames"),
        ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties"),
        ({"properties": {"a": {"properties": {"b": {"not": {"minimum": 1}}}}}}, "not"),
        ({"$ref": "#/$defs/missing"}, "$ref"),
        ({"type": "string", "pattern": "(("}, "pattern"),
        ({"type": "strings"}, "type"),
        ({"type": "string", "format": "regex"}, "format"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
        ({"type": "string", "pattern": "^(?!x)"}, "pattern"),  # look-around: valid, unsupported
        ({"$ref": "https://example.org/schema.json"}, "$ref"),  # remote
        ({"type": "object", "properties": {"a": {}}, "minProperties": 1}, "minProperties"),
        ({"type": "object", "properties": {"a": {}}, "maxProperties": 1}, "maxProperties"),
        ({"properties": {"a": {"$ref": "#", "required": ["a"]}}}, "$ref"),  # circular, beside
        ({"if": {"pattern": "a"}, "else": {"type": "integer"}}, "if"),
        ({"type": "integer", "minimum": "x"}, "minimum"),
        ({"type": "object", "x-guidance": {"lenient": True}}, "x-guidance"),
    ],
)
def test_what_cannot_be_enforced_is_refused_naming_field_and_keyword(
    schema: dict[str, Any], keyword: str
) -> None:
    with pytest.raises(GrammarError) as raised:
        json_schema_grammar(schema, FIELD)
    assert raised.value.field == FIELD and raised.value.keyword == keyword
    assert FIELD in raised.value.message and repr(keyword) in raised.value.message


def test_a_valid_schema_is_never_called_invalid() -> None:
    for schema in (
        {"type": "string", "pattern": "^(?!x)"},
        {"$ref": "https://example.org/schema.json"},
        {"type": "object", "properties": {"a": {}}, "minProperties": 1},
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    ):
        with pytest.raises(GrammarError) as raised:
            json_schema_grammar(schema, FIELD)
        assert "not a valid" not in raised.value.message


def test_a_schema_that_is_no_object_is_refused() -> None:
    for schema in ([{"type": "object"}], "object", None):
        with pytest.raises(GrammarError, match="must be a JSON Schema object"):
            json_schema_grammar(schema, FIELD)


def test_a_large_schema_is_bounded_by_llguidance_not_by_its_size() -> None:
    # Over 32 KiB, the cap Trickle had: compiled like any other.
    properties = {f"p{i}": {"type": "string", "maxLength": 8} for i in range(2000)}
    schema = {"type": "object", "properties": properties}
    assert len(json.dumps(schema)) > 64 * 1024
    json_schema_grammar(schema, FIELD)


def test_a_schema_nested_too_deep_is_refused_before_it_is_read() -> None:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(5000):  # deeper than json.dumps or a recursive walk could go
        schema = {"type": "array", "items": schema}
    with pytest.raises(GrammarError, match="nests deeper than") as raised:
        json_schema_grammar(schema, FIELD)
    assert raised.value.field == FIELD
    shallow: dict[str, Any] = {"type": "integer"}
    for _ in range(20):
        shallow = {"type": "array", "items": shallow}
    json_schema_grammar(shallow, FIELD)


def test_a_small_schema_whose_grammar_explodes_hits_the_limits() -> None:
    # allOf over anyOfs is compiled as their product: 8**6 branches from 4 KiB of JSON.
    schema = {
        "allOf": [
            {
                "anyOf": [
                    {"properties": {f"p{i}{j}": {"type": "integer"}}, "required": [f"p{i}{j}"]}
                    for j in range(8)
                ]
            }
            for i in range(6)
        ]
    }
    assert len(json.dumps(schema)) < 4096
    with pytest.raises(GrammarError, match=r"past the bound .*too large or complex") as raised:
        json_schema_grammar(schema, FIELD)
    assert raised.value.field == FIELD


def test_grammars_are_cached_per_schema_text() -> None:
    schema = {"type": "object", "properties": {"cached": {"type": "integer"}}}
    assert json_schema_grammar(schema, FIELD) is json_schema_grammar(dict(schema), FIELD)
    # Key order is the order the answer writes properties in: another schema.
    swapped = {"properties": schema["properties"], "type": "object"}
    assert json_schema_grammar(swapped, FIELD) is not json_schema_grammar(schema, FIELD)


@pytest.mark.parametrize(
    ("message", "bound"),
    [
        (
            "grammar size (number of symbols) too big (limit for this grammar: 500000)",
            "max_grammar_size (500000)",
        ),
        (
            "initial lexer configuration (grammar) too big (limit for this grammar: 1000000)",
            "initial_lexer_fuel (1000000)",
        ),
        ("schema too large", "llguidance's JSON Schema size limit"),
    ],
)
def test_llguidance_bounds_are_named(message: str, bound: str) -> None:
    error = schema_error(FIELD, message)
    assert error.field == FIELD and f"past the bound {bound}" in error.message


def test_patterns_are_generated_anchored_at_the_start_and_data_is_left_alone(
    tokenizer: llguidance.LLTokenizer,
) -> None:
    """An unanchored ``pattern`` allows only strings that begin with a match (each one valid
    under the schema as sent); a ``pattern`` key inside ``const`` is data, not rewritten."""
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "b|c"},
            "pattern": {"const": {"pattern": "x"}},
        },
    }
    anchored = anchor_patterns(schema)
    assert anchored["properties"]["a"]["pattern"] == "^(?:b|c)"
    assert anchored["properties"]["pattern"] == {"const": {"pattern": "x"}}
    named = anchor_patterns({"properties": {"const": {"type": "string", "pattern": "b"}}})
    assert named["properties"]["const"]["pattern"] == "^(?:b)"  # a property named const
    assert anchor_patterns({"pattern": "a)|(b"}) == {"pattern": "a)|(b"}  # no regex: as sent
    assert anchor_patterns({"pattern": "(?x)a # note"}) == {"pattern": "(?x)a # note"}
    grammar = json_schema_grammar({"type": "string", "pattern": r"\d{2}"}, "response_format")
    assert matches(tokenizer, grammar, '"12"') and matches(tokenizer, grammar, '"12ab"')
    assert not matches(tokenizer, grammar, '"ab12"')


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "array",
            "uniqueItems": True,
            "items": {"enum": [1, 2]},
            "anyOf": [{}],
            "allOf": 5,
        },
        {"oneOf": [{"enum": [1, 2]}, {"enum": [2, 3]}], "anyOf": [{}], "allOf": 5},
    ],
)
def test_a_rewrite_beside_an_allof_that_is_no_list_is_a_400(schema: dict[str, Any]) -> None:
    with pytest.raises(GrammarError, match="allOf"):
        json_schema_grammar(schema, FIELD)
