"""``oneOf`` rewritten as ``anyOf`` exactly where no instance can match two branches: each
proof (types, a discriminator, a required key another closed branch forbids) on its own, and
the overlapping shapes that must stay ``oneOf`` (so llguidance refuses them, naming it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from trickle.one_of import MAX_NEGATED_ONE_OFS, exclusive_one_of

CAT = {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]}
DOG = {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]}

DISJOINT: list[list[Any]] = [
    [{"type": "integer"}, {"type": "string"}, {"type": "null"}],
    [{"type": ["string", "null"]}, {"type": "boolean"}],
    [{"const": 1}, {"const": 2}],
    [{"enum": ["a", "b"]}, {"enum": ["c"]}],
    [{"const": "x"}, {"type": "integer"}],
    [CAT, DOG],
    # The discriminator's type, not its value: a string and an integer.
    [
        {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
        {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
    ],
    # A required key the other, closed, branch does not allow.
    [
        {"type": "object", "properties": {"a": {}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {}}, "additionalProperties": False},
    ],
    # Through local $refs.
    [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}],
    # Through allOf.
    [
        {
            "allOf": [{"type": "object"}, {"required": ["kind"]}],
            "properties": {"kind": {"const": 1}},
        },
        {"type": "object", "properties": {"kind": {"const": 2}}},
    ],
]

# Overlapping branches whose complements trickle.negation cannot write (a number that is no
# integer, a string longer than 3, a remote schema) or that no instance matches alone.
OVERLAPPING: list[list[Any]] = [
    [{"type": "integer"}, {"type": "number"}],  # 1 matches both
    [{"type": "string"}, {"type": "string", "maxLength": 3}],
    [{"const": 1}, {"const": 1.0}],
    [{"$ref": "https://example.org/a"}, {"$ref": "#/$defs/missing"}],
    [{"type": "object", "required": ["a"]}, {"type": "object", "minProperties": 1}],
]
# Overlapping branches that are written each without the others.
EACH_ALONE: list[list[Any]] = [
    [{"enum": ["a", "b"]}, {"enum": ["b"]}],
    # The discriminator is not required: {} matches both.
    [
        {"type": "object", "properties": {"kind": {"const": "cat"}}},
        {"type": "object", "properties": {"kind": {"const": "dog"}}},
    ],
    # Not an object by its schema: "x" matches both (required means nothing on a string).
    [
        {"properties": {"kind": {"const": 1}}, "required": ["kind"]},
        {"properties": {"kind": {"const": 2}}},
    ],
    [{}, {"type": "null"}],
    [{"type": "object", "required": ["a"]}, {"type": "object", "properties": {"b": {}}}],  # open
    [{"type": "object", "required": ["a", "b"]}, {"required": ["c"]}, {"type": ["object", "null"]}],
    [{"enum": ["a", "b"]}, {"enum": ["b", "x"]}, {"const": "x"}],
]
EACH_ALONE_VALUES = [
    *("a", "b", "x", 1, 1.0, None, True, {}, {"a": 1}, {"a": 1, "b": 2}, {"c": 0}),
    *({"a": 1, "b": 2, "c": 3}, {"kind": "cat"}, {"kind": "dog"}, {"kind": 1}, {"kind": 2}),
]


def wrap(branches: list[Any]) -> dict[str, Any]:
    return {"$defs": {"cat": CAT, "dog": DOG}, "oneOf": branches}


@pytest.mark.parametrize("branches", DISJOINT)
def test_disjoint_branches_become_any_of(branches: list[Any]) -> None:
    rewritten = exclusive_one_of(wrap(branches))
    assert rewritten["anyOf"] == branches and "oneOf" not in rewritten


@pytest.mark.parametrize("branches", OVERLAPPING)
def test_branches_that_may_overlap_stay_one_of(branches: list[Any]) -> None:
    assert exclusive_one_of(wrap(branches)) == wrap(branches)


@pytest.mark.parametrize("branches", EACH_ALONE)
def test_overlapping_branches_are_each_written_without_the_others(branches: list[Any]) -> None:
    schema = wrap(branches)
    rewritten = exclusive_one_of(schema)
    assert "oneOf" not in rewritten
    before, after = Draft202012Validator(schema), Draft202012Validator(rewritten)
    verdicts = [before.is_valid(value) for value in EACH_ALONE_VALUES]
    assert any(verdicts) and not all(verdicts)
    for value, verdict in zip(EACH_ALONE_VALUES, verdicts, strict=True):
        assert after.is_valid(value) == verdict, (value, rewritten)


def test_the_enclosing_schema_says_what_every_branch_is() -> None:
    # The common discriminated union: type and required beside oneOf, consts in the branches.
    schema = {
        "type": "object",
        "properties": {"kind": {"type": "string"}},
        "required": ["kind"],
        "oneOf": [
            {"properties": {"kind": {"const": "a"}}},
            {"properties": {"kind": {"const": "b"}}},
        ],
    }
    assert list(exclusive_one_of(schema)) == ["type", "properties", "required", "anyOf"]


def test_nested_one_ofs_are_rewritten_and_data_is_not() -> None:
    inner = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    data = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    schema = {
        "type": "object",
        "properties": {"enum": inner, "x": {"type": "array", "items": inner}},
        "default": data,
        "examples": [data],
    }
    rewritten = exclusive_one_of(schema)
    assert "anyOf" in rewritten["properties"]["enum"]
    assert "anyOf" in rewritten["properties"]["x"]["items"]
    assert rewritten["default"] == data and rewritten["examples"] == [data]


def test_one_of_beside_any_of_joins_all_of() -> None:
    branches = [{"type": "string"}, {"type": "integer"}]
    schema = {"anyOf": [{"type": "string"}, {"minimum": 0}], "oneOf": branches}
    rewritten = exclusive_one_of(schema)
    assert rewritten["anyOf"] == schema["anyOf"] and rewritten["allOf"] == [{"anyOf": branches}]


def test_branches_that_each_require_one_key_forbid_the_others() -> None:
    schema = {
        "type": "object",
        "properties": {"src": {"type": "string"}, "handle": {"type": "string"}},
        "oneOf": [{"required": ["src"]}, {"required": ["handle"], "title": "by handle"}],
    }
    assert exclusive_one_of(schema)["anyOf"] == [
        {"required": ["src"], "properties": {"handle": False}},
        {"required": ["handle"], "title": "by handle", "properties": {"src": False}},
    ]
    # Not said to be an object: "x" matches both branches, so oneOf refuses it; each branch
    # is then an object that lacks the other's key.
    untyped = {"oneOf": schema["oneOf"]}
    assert exclusive_one_of(untyped)["anyOf"][0] == {
        "allOf": [{"required": ["src"]}, {"type": "object", "properties": {"handle": False}}]
    }


def test_a_self_referencing_branch_ends() -> None:
    schema = {"$defs": {"loop": {"$ref": "#/$defs/loop"}}, "oneOf": [{"$ref": "#/$defs/loop"}, {}]}
    assert exclusive_one_of(schema) == schema


# Generated branches and values from one small universe, so that a value matching two branches
# is likely to be drawn wherever one exists.
_SCALARS = st.sampled_from([None, True, False, 0, 1, 1.0, 1.5, "cat", "dog", "x"])
_KEYS = st.sampled_from(["kind", "a", "b"])
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=2), st.dictionaries(_KEYS, inner, max_size=3)),
    max_leaves=6,
)
_TYPES = st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"])
_LEAVES = st.one_of(
    st.just({}),
    _TYPES.map(lambda kind: {"type": kind}),
    st.lists(_TYPES, min_size=1, max_size=3, unique=True).map(lambda kinds: {"type": kinds}),
    _SCALARS.map(lambda value: {"const": value}),
    st.lists(_SCALARS, min_size=1, max_size=3).map(lambda values: {"enum": values}),
)
_OBJECTS = st.builds(
    lambda typed, properties, required, closed: {
        **({"type": "object"} if typed else {}),
        "properties": properties,
        "required": required,
        **({"additionalProperties": False} if closed else {}),
    },
    st.booleans(),
    st.dictionaries(_KEYS, _LEAVES, max_size=2),
    st.lists(_KEYS, max_size=2, unique=True),
    st.booleans(),
)
_ONE_KEY = _KEYS.map(lambda key: {"required": [key]})
_BRANCHES = st.lists(st.one_of(_LEAVES, _OBJECTS, _ONE_KEY), min_size=2, max_size=3)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(branches=_BRANCHES, siblings=st.one_of(st.just({}), _OBJECTS), values=st.lists(_VALUES))
def test_a_rewritten_one_of_accepts_exactly_what_it_did(
    branches: list[Any], siblings: dict[str, Any], values: list[Any]
) -> None:
    schema = {**siblings, "oneOf": branches}
    rewritten = exclusive_one_of(schema)
    if rewritten == schema:
        return
    before, after = Draft202012Validator(schema), Draft202012Validator(rewritten)
    for value in values:
        assert before.is_valid(value) == after.is_valid(value), value
    # And as anyOf, no value matches two branches.
    for value in values:
        matching = [
            b
            for b in rewritten["anyOf"]
            if Draft202012Validator({"allOf": [siblings, b]}).is_valid(value)
        ]
        assert len(matching) <= 1, (value, matching)


def test_a_hostile_schema_s_proofs_stay_bounded() -> None:
    # 200 branches told apart only by their last nested key: each pair's proof walks 100
    # values, 20,000 pairs. Past the step budget nothing more is proved: the oneOf stays
    # (refused), though five such branches are proved disjoint.
    def branch(number: int) -> dict[str, Any]:
        def inner(i: int) -> dict[str, Any]:
            values = {f"j{m}": {"const": number if (i, m) == (9, 9) else 0} for m in range(10)}
            return {"type": "object", "properties": values, "required": sorted(values)}

        properties = {f"k{i}": inner(i) for i in range(10)}
        return {"type": "object", "properties": properties, "required": sorted(properties)}

    schema = {"oneOf": [branch(number) for number in range(200)]}
    assert exclusive_one_of(schema) == schema
    assert "anyOf" in exclusive_one_of({"oneOf": [branch(number) for number in range(5)]})


def _nested_overlapping(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        overlapping = [
            {"required": ["a"], "properties": {"a": {"enum": [1, 2]}}},
            {"properties": {"a": {"enum": [2, 3]}}},
        ]
        schema = {"type": "object", "properties": {"x": schema}, "oneOf": overlapping}
    return schema


def test_only_the_innermost_overlapping_one_ofs_are_written_without_the_others() -> None:
    """Each such rewrite multiplies what llguidance's check walks: past MAX_NEGATED_ONE_OFS
    the outer ones stay (refused by name) instead of costing seconds and gigabytes."""
    written = exclusive_one_of(_nested_overlapping(MAX_NEGATED_ONE_OFS))
    assert "oneOf" not in json.dumps(written)
    outer = exclusive_one_of(_nested_overlapping(MAX_NEGATED_ONE_OFS + 2))
    assert json.dumps(outer).count('"oneOf"') == 2
