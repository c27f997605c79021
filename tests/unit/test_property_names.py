"""``propertyNames`` rewritten into ``properties``, ``patternProperties`` and
``additionalProperties``: jsonschema gives every instance the same verdict under the schema as
sent and as rewritten, and the rewrite is a grammar llguidance takes (the keyword itself it
refuses)."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft4Validator, Draft7Validator, Draft202012Validator

from trickle.grammar import GrammarError, json_schema_grammar
from trickle.property_names import exact_property_names

FIELD = "response_format.json_schema.schema"
OBJECTS: list[Any] = [
    {},
    {"a": 1},
    {"a": "x"},
    {"b": 2},
    {"a": 1, "b": "y"},
    {"ab": 1},
    {"A": 1},
    {"1": "x"},
    {"12": "x", "0": "y"},
    {"a": 1, "c": 3},
    "not an object",
]
SHAPES: dict[str, dict[str, Any]] = {
    "any string": {"type": "object", "propertyNames": {"type": "string"}},
    "enum": {"propertyNames": {"enum": ["a", "b"]}, "additionalProperties": {"type": "integer"}},
    "enum beside properties": {
        "properties": {"a": {"type": "integer"}, "c": {"type": "integer"}},
        "propertyNames": {"type": "string", "enum": ["a", "b"]},
    },
    "enum beside a match-all pattern": {
        "type": "object",
        "propertyNames": {"$ref": "#/$defs/name"},
        "patternProperties": {".*": {"type": "integer"}},
        "additionalProperties": False,
        "$defs": {"name": {"description": "a name", "type": "string", "enum": ["a", "b"]}},
    },
    "pattern": {
        "type": "object",
        "propertyNames": {"pattern": "^[1-9][0-9]*$"},
        "additionalProperties": {"type": "string"},
    },
    "unanchored pattern": {"propertyNames": {"pattern": "b"}},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_rewritten_property_names_gives_every_object_the_same_verdict(shape: str) -> None:
    schema = SHAPES[shape]
    rewritten = exact_property_names(schema)
    assert "propertyNames" not in rewritten
    before, after = Draft202012Validator(schema), Draft202012Validator(rewritten)
    for instance in OBJECTS:
        assert after.is_valid(instance) == before.is_valid(instance), (instance, rewritten)
    json_schema_grammar(schema, FIELD)


@pytest.mark.parametrize(
    "names",
    [
        {"maxLength": 3},  # a length: no keyword of the object says it
        {"enum": ["a", 1]},  # a name that is no string
        {"type": "integer"},  # no key is one: the object must be empty; not rewritten
    ],
)
def test_any_other_property_names_stays_and_is_refused_by_name(names: dict[str, Any]) -> None:
    schema = {"type": "object", "propertyNames": names}
    assert exact_property_names(schema) == schema
    with pytest.raises(GrammarError) as raised:
        json_schema_grammar(schema, FIELD)
    assert raised.value.keyword == "propertyNames"


def test_a_pattern_beside_listed_properties_stays() -> None:
    schema = {"properties": {"x": {}}, "propertyNames": {"pattern": "^a"}}
    assert exact_property_names(schema) == schema


def test_a_property_named_property_names_in_dependencies_is_no_keyword() -> None:
    """``dependencies`` maps names to schemas: one named ``propertyNames`` stays a dependency."""
    schema = {"type": "object", "dependencies": {"propertyNames": {"enum": ["x"]}}}
    assert exact_property_names(schema) == schema
    judge = Draft7Validator(schema)
    assert not judge.is_valid({"propertyNames": 1}) and judge.is_valid({"y": 1})


def test_an_anchored_match_all_pattern_is_not_taken_for_every_key() -> None:
    """``^.*$`` fails on a key holding a newline: beside it the names are not rewritten."""
    schema = {
        "type": "object",
        "propertyNames": {"enum": ["a\nb"]},
        "patternProperties": {"^.*$": {}},
        "additionalProperties": False,
    }
    assert exact_property_names(schema) == schema


def test_draft_4_has_no_property_names_so_it_constrains_nothing() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "propertyNames": {"enum": ["a"]},
    }
    rewritten = exact_property_names(schema)
    assert "propertyNames" not in rewritten
    assert Draft4Validator(schema).is_valid({"b": 1}) and Draft4Validator(rewritten).is_valid(
        {"b": 1}
    )
    json_schema_grammar(schema, FIELD)
