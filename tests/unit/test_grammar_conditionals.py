"""Conditionals served end to end: the grammar built from a schema with ``if``/``then``/``else``,
``not`` or dependencies (rewritten by ``trickle.conditionals``, compiled by llguidance against the
demo model's vocabulary) matches exactly the instances jsonschema accepts under the schema as
sent, on hand-picked and generated instances. The grammar writes an object's properties in an
order of its own, so an instance counts as matched when one order of its keys is."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft7Validator, Draft202012Validator

from tests.llg_tokenizer import llg_tokenizer, matches
from trickle.grammar import GrammarError, json_schema_grammar

FIELD = "response_format.json_schema.schema"
KIND = {"enum": ["cat", "dog", "cow"]}
PETS = {
    "type": "object",
    "properties": {"kind": KIND, "a": {"type": "integer"}, "b": {"type": "string"}},
    "required": ["kind"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> llguidance.LLTokenizer:
    return llg_tokenizer(demo_model_dir / "tokenizer.model")


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def matched(tokenizer: llguidance.LLTokenizer, grammar: str, instance: Any) -> bool:
    """Whether the grammar matches ``instance`` with its keys in some order."""
    if not isinstance(instance, dict):
        return matches(tokenizer, grammar, compact(instance))
    return any(
        matches(tokenizer, grammar, compact(dict(order)))
        for order in itertools.permutations(instance.items())
    )


SERVED: list[tuple[dict[str, Any], list[Any]]] = [
    (
        {**PETS, "dependentRequired": {"a": ["b"]}},
        [{"kind": "cat"}, {"kind": "cat", "a": 1, "b": "x"}, {"kind": "cat", "a": 1}],
    ),
    (
        {**PETS, "dependencies": {"b": {"properties": {"kind": {"const": "dog"}}}}},
        [{"kind": "dog", "b": "x"}, {"kind": "cat", "b": "x"}, {"kind": "cat", "a": 2}],
    ),
    (
        {
            **PETS,
            "if": {"properties": {"kind": {"const": "cow"}}},
            "then": {"required": ["a"]},
            "else": {"properties": {"a": False}},
        },
        [{"kind": "cow", "a": 1}, {"kind": "cow"}, {"kind": "dog"}, {"kind": "dog", "a": 1}],
    ),
    (
        {
            **PETS,
            "allOf": [
                {"if": {"properties": {"kind": {"const": "cat"}}}, "then": {"required": ["b"]}},
                {"if": {"required": ["a"]}, "then": {"properties": {"kind": {"const": "dog"}}}},
            ],
        },
        [
            *({"kind": "cat", "b": "x"}, {"kind": "cat"}, {"kind": "dog", "a": 1}, {"kind": "cow"}),
            *({"kind": "cow", "a": 1}, {"kind": "cat", "a": 1, "b": "x"}),
        ],
    ),
    (
        {"type": "object", "properties": {"x": {}, "y": {}}, "not": {"required": ["x", "y"]}},
        [{}, {"x": 1}, {"y": 1}, {"x": 1, "y": 2}],
    ),
    ({"type": ["string", "integer", "null"], "not": {"type": "null"}}, ["a", 1, None]),
    # Generated anchored: a string that begins with a character outside the class.
    ({"type": "string", "not": {"pattern": "^[a-c.]+$"}}, ["", "x", "xa", "ab", "a.c"]),
]


@pytest.mark.parametrize(("schema", "instances"), SERVED)
def test_a_served_conditional_matches_what_the_schema_accepts(
    tokenizer: llguidance.LLTokenizer, schema: dict[str, Any], instances: list[Any]
) -> None:
    grammar = json_schema_grammar(schema, FIELD)
    checker = Draft7Validator(schema) if "dependencies" in schema else Draft202012Validator(schema)
    verdicts = [checker.is_valid(instance) for instance in instances]
    assert any(verdicts) and not all(verdicts)
    for instance, verdict in zip(instances, verdicts, strict=True):
        assert matched(tokenizer, grammar, instance) == verdict, instance


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "object", "if": {"properties": {"k": {"const": "a"}}}, "then": False}, "if"),
        ({"type": "number", "not": {"type": "integer"}}, "not"),
        ({"type": "object", "dependencies": {"a": "b"}}, "dependencies"),
    ],
)
def test_a_conditional_without_an_exact_rewrite_is_refused_by_name(
    schema: dict[str, Any], keyword: str
) -> None:
    with pytest.raises(GrammarError) as raised:
        json_schema_grammar(schema, FIELD)
    assert raised.value.keyword == keyword


_VALUES = st.sampled_from([None, True, 0, 1, "cat", "dog", "cow"])
_INSTANCES = st.dictionaries(st.sampled_from(["kind", "a", "b"]), _VALUES, max_size=3)
_KINDS = st.lists(st.sampled_from(["cat", "dog", "cow"]), min_size=1, max_size=2, unique=True)
_KEYS = st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2, unique=True)
_TESTS = st.one_of(
    _KINDS.map(lambda kinds: {"properties": {"kind": {"enum": kinds}}}),
    _KINDS.map(lambda kinds: {"properties": {"kind": {"enum": kinds}}, "required": ["kind"]}),
    _KEYS.map(lambda keys: {"required": keys}),
)
_ASKED = st.one_of(
    _KEYS.map(lambda keys: {"required": keys}),
    _KEYS.map(lambda keys: {"properties": dict.fromkeys(keys, False)}),
    _KINDS.map(lambda kinds: {"properties": {"kind": {"enum": kinds}}}),
)
_CONDITIONALS = st.one_of(
    st.builds(lambda test, then: {"if": test, "then": then}, _TESTS, _ASKED),
    st.builds(lambda test, other: {"if": test, "else": other}, _TESTS, _ASKED),
    _TESTS.map(lambda test: {"not": test}),
    st.builds(lambda key, keys: {"dependentRequired": {key: keys}}, st.sampled_from("ab"), _KEYS),
    st.builds(lambda key, asked: {"dependentSchemas": {key: asked}}, st.sampled_from("ab"), _ASKED),
)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(
    conditionals=st.lists(_CONDITIONALS, min_size=1, max_size=2),
    closed=st.booleans(),
    instances=st.lists(_INSTANCES, min_size=1, max_size=8),
)
def test_a_served_conditional_s_grammar_matches_exactly_the_valid_instances(
    tokenizer: llguidance.LLTokenizer,
    conditionals: list[dict[str, Any]],
    closed: bool,
    instances: list[Any],
) -> None:
    schema = {
        "type": "object",
        "properties": {"kind": KIND, "a": {"type": "integer"}, "b": {}},
        "additionalProperties": not closed,
        "allOf": conditionals,
    }
    checker = Draft202012Validator(schema)
    try:
        grammar = json_schema_grammar(schema, FIELD)
    except GrammarError:  # llguidance refuses a schema that nothing matches
        assert not any(checker.is_valid(instance) for instance in instances)
        return
    for instance in instances:
        assert matched(tokenizer, grammar, instance) == checker.is_valid(instance), instance
