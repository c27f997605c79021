"""``if``/``then``/``else``, ``not`` and dependencies rewritten without them exactly where that
can be done: each rewrite accepts what the schema as sent accepts and nothing else (jsonschema
judges both, on hand-picked and generated instances), and the shapes that cannot be rewritten
exactly are kept, for llguidance to refuse by name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft7Validator, Draft202012Validator

from trickle.conditionals import exact_conditionals

REWRITTEN_KEYWORDS = ("if", "then", "else", "not", "dependencies", "dependentRequired")
KIND = {"type": "string", "enum": ["cat", "dog", "cow"]}


def validator(schema: object) -> Draft7Validator | Draft202012Validator:
    """``dependencies`` is a keyword up to draft 7; the rest are 2020-12's."""
    if '"dependencies"' in json.dumps(schema):
        return Draft7Validator(schema)
    return Draft202012Validator(schema)


def keywords(schema: object) -> set[str]:
    """Every key of every object in ``schema`` (property names included: tests use none of the
    rewritten keywords' names as one)."""
    if isinstance(schema, dict):
        return set(schema).union(*(keywords(value) for value in schema.values()))
    if isinstance(schema, list):
        return set().union(*(keywords(item) for item in schema))
    return set()


def assert_same(schema: dict[str, Any], instances: list[Any]) -> dict[str, Any]:
    """The rewrite holds none of the rewritten keywords and accepts exactly what ``schema``
    does among ``instances`` (both kinds present)."""
    rewritten = exact_conditionals(schema)
    assert not keywords(rewritten) & set(REWRITTEN_KEYWORDS), rewritten
    before, after = validator(schema), validator(rewritten)
    verdicts = [before.is_valid(instance) for instance in instances]
    assert any(verdicts) and not all(verdicts), "instances of both kinds"
    for instance, verdict in zip(instances, verdicts, strict=True):
        assert after.is_valid(instance) == verdict, (instance, verdict, rewritten)
    return rewritten


def test_dependent_required_keys_come_with_their_key() -> None:
    schema = {
        "type": "object",
        "properties": {"card": {"type": "string"}, "address": {"type": "string"}},
        "dependentRequired": {"card": ["address"]},
    }
    rewritten = assert_same(
        schema,
        [{}, {"address": "x"}, {"card": "1", "address": "x"}, {"card": "1"}, {"card": 1}],
    )
    assert rewritten["anyOf"] == [{"properties": {"card": False}}, {"required": ["address"]}]


def test_dependencies_as_drafts_4_to_7_read_them() -> None:
    lists = {"type": "object", "dependencies": {"a": ["b", "c"], "d": []}}
    assert_same(lists, [{}, {"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1}, {"b": 1}, {"d": 1}])
    schemas = {
        "properties": {"a": {}, "b": {}},
        "dependencies": {"a": {"properties": {"b": {"type": "integer"}}, "required": ["b"]}},
    }
    assert_same(schemas, [{"a": 1, "b": 2}, {"a": 1, "b": "2"}, {"a": 1}, {"b": "2"}, "x", {}])


def test_dependent_schemas_hold_where_their_key_is() -> None:
    schema = {
        "type": "object",
        "dependentSchemas": {"a": {"required": ["b"]}, "c": {"not": {"required": ["d"]}}},
    }
    assert_same(schema, [{}, {"a": 1, "b": 1}, {"a": 1}, {"c": 1}, {"c": 1, "d": 1}, {"d": 1}, 3])


def test_a_key_the_schema_requires_or_forbids_asks_unconditionally_or_nothing() -> None:
    required = {"type": "object", "required": ["a"], "dependentRequired": {"a": ["b"]}}
    assert exact_conditionals(required)["anyOf"] == [{"required": ["b"]}]
    closed = {
        "type": "object",
        "properties": {"b": {}},
        "additionalProperties": False,
        "dependentRequired": {"a": ["b"]},
    }
    assert exact_conditionals(closed) == {key: closed[key] for key in list(closed)[:3]}


def test_if_on_a_discriminator_takes_the_other_values_from_the_enclosing_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"kind": KIND, "moo": {"type": "boolean"}},
        "required": ["kind"],
        "if": {"properties": {"kind": {"const": "cow"}}},
        "then": {"required": ["moo"]},
        "else": {"properties": {"moo": False}},
    }
    rewritten = assert_same(
        schema,
        [
            {"kind": "cow", "moo": True},
            {"kind": "cow"},
            {"kind": "cat"},
            {"kind": "dog", "moo": False},
            {"kind": "emu"},
        ],
    )
    assert rewritten["anyOf"][1]["allOf"][0] == {
        "type": "object",
        "required": ["kind"],
        "properties": {"kind": {"enum": ["cat", "dog"]}},
    }


def test_ifs_inside_all_of_read_the_schema_around_them() -> None:
    # SchemaStore's shape: a list of if/then in allOf, the discriminator's values beside it.
    schema = {
        "type": "object",
        "properties": {"kind": KIND, "a": {}, "b": {}},
        "allOf": [
            {"if": {"properties": {"kind": {"const": "cat"}}}, "then": {"required": ["a"]}},
            {
                "if": {"properties": {"kind": {"enum": ["dog", "cow"]}}, "required": ["kind"]},
                "then": {"required": ["b"]},
                "else": {"properties": {"b": False}},
            },
        ],
    }
    assert_same(
        schema,
        [
            *({"kind": "cat", "a": 1}, {"kind": "cat"}, {"kind": "dog", "b": 1}, {"kind": "dog"}),
            *({}, {"a": 1}, {"b": 1}, {"kind": "cat", "a": 1, "b": 1}, {"kind": "cow", "b": 2}),
        ],
    )


def test_if_on_required_keys_and_types() -> None:
    keys = {
        "if": {"required": ["a", "b"]},
        "then": {"required": ["c"]},
        "else": {"maxProperties": 1},
    }
    assert_same(keys, [{"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1}, {"a": 1}, {"a": 1, "c": 1}, 1])
    types = {"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "integer"}}
    assert_same(types, ["ab", "a", 1, 1.5, None, [], {}])
    # Not an integer: a number that is not one has no type of its own, unless none can be one.
    integer = {"type": ["integer", "string"], "not": {"type": "integer"}}
    assert_same(integer, ["a", 1, 2.0])


@pytest.mark.parametrize(
    "schema",
    [
        {"not": {"type": "string"}},
        {"not": {"required": ["a"]}},
        {"not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}},
        {"not": {"allOf": [{"type": "object"}, {"required": ["a"]}]}},
        {"type": "boolean", "not": {"const": True}},
        {"enum": ["a", "b", 1], "not": {"enum": ["a", 1.0]}},
        {
            "properties": {"x": {"type": ["boolean", "null"]}},
            "not": {"properties": {"x": {"const": None}}},
        },
        {"not": {"not": {"type": "array"}}},
        {"$defs": {"a": {"required": ["a"]}}, "not": {"$ref": "#/$defs/a"}},
        {"properties": {"p": {"properties": {"q": {"not": {"type": "null"}}}}}},
        # A whole string of one class, refused: a character outside it (or no character).
        {"not": {"pattern": "^[a-b]+$"}},
        {"type": "string", "not": {"pattern": "^[\\s.,-]*$"}},
    ],
)
def test_not_becomes_its_complement(schema: dict[str, Any]) -> None:
    values = [None, True, False, 0, 1, 1.5, "a", "b", [], [1], {}, {"a": 1}, {"b": 1}, {"x": None}]
    values += ["", "ab", "abc", " ,-", ". x", "x. "]
    values += [{"x": True}, {"a": 1, "b": 2}, {"p": {"q": None}}, {"p": {"q": 1}}]
    assert_same(schema, values)


@pytest.mark.parametrize(
    ("schema", "kept"),
    [
        # The other values of an open string are not listed.
        ({"if": {"properties": {"k": {"const": "a"}}}, "then": {"required": ["b"]}}, "if"),
        ({"not": {"pattern": "^a"}}, "not"),
        ({"not": {"pattern": "^[a-z]+"}}, "not"),  # a prefix, not the whole string
        ({"not": {"pattern": "^[^a-z]+$"}}, "not"),
        ({"not": {"pattern": "^[a--z]+$"}}, "not"),  # a set operation in some dialects
        ({"not": {"minimum": 3}}, "not"),
        ({"not": {"type": "integer"}}, "not"),  # 1.5 is no integer, and no type says so
        ({"not": {"$ref": "https://example.org/a"}}, "not"),
        ({"dependencies": {"a": "b"}}, "dependencies"),  # draft 3's string form
        ({"not": {"properties": {"a": {"minLength": 2}}}}, "not"),
    ],
)
def test_what_has_no_exact_rewrite_is_kept(schema: dict[str, Any], kept: str) -> None:
    rewritten = exact_conditionals(schema)
    assert kept in rewritten and rewritten[kept] == schema[kept]


def test_keywords_alone_and_data_are_left_alone() -> None:
    # then without if means nothing; if without then or else asks nothing.
    assert exact_conditionals({"then": {"type": "string"}, "else": False}) == {}
    assert exact_conditionals({"type": "integer", "if": {"minimum": 3}}) == {"type": "integer"}
    # Nothing matches: a property that must be absent; a whole schema stays, refused.
    assert exact_conditionals({"properties": {"a": {"not": {}}}}) == {"properties": {"a": False}}
    assert exact_conditionals({"type": "object", "not": {}}) == {"type": "object", "not": {}}
    data = {"not": {"type": "string"}, "if": {"required": ["x"]}}
    schema = {"properties": {"not": {"const": data}, "if": {}}, "default": data, "enum": [data]}
    assert exact_conditionals(schema) == schema


# Generated schemas and instances from one small universe, so that instances on both sides of
# every rewritten keyword are likely to be drawn.
_KEYS = st.sampled_from(["kind", "a", "b"])
_SCALARS = st.sampled_from([None, True, False, 0, 1, 1.5, "cat", "dog", "x"])
_INSTANCES = st.one_of(
    _SCALARS, st.lists(_SCALARS, max_size=2), st.dictionaries(_KEYS, _SCALARS, max_size=3)
)
_TYPES = st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"])
_LEAVES = st.one_of(
    st.just({}),
    st.booleans(),
    _TYPES.map(lambda kind: {"type": kind}),
    st.lists(_TYPES, min_size=1, max_size=3, unique=True).map(lambda kinds: {"type": kinds}),
    _SCALARS.map(lambda value: {"const": value}),
    st.lists(_SCALARS, min_size=1, max_size=3).map(lambda values: {"enum": values}),
    st.lists(_KEYS, min_size=1, max_size=2, unique=True).map(lambda keys: {"required": keys}),
)
_OBJECTS = st.builds(
    lambda properties, required, closed: {
        "properties": properties,
        **({"required": required} if required else {}),
        **({"additionalProperties": False} if closed else {}),
    },
    st.dictionaries(_KEYS, _LEAVES, max_size=2),
    st.lists(_KEYS, max_size=2, unique=True),
    st.booleans(),
)
_TESTS = st.recursive(
    st.one_of(_LEAVES, _OBJECTS),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=2).map(lambda items: {"anyOf": items}),
        st.lists(inner, min_size=1, max_size=2).map(lambda items: {"allOf": items}),
        inner.map(lambda item: {"not": item}),
    ),
    max_leaves=4,
)
_CONDITIONALS = st.one_of(
    _TESTS.map(lambda test: {"not": test}),
    st.builds(
        lambda test, then, otherwise: {"if": test, "then": then, "else": otherwise},
        _TESTS,
        st.one_of(_LEAVES, _OBJECTS),
        st.one_of(_LEAVES, _OBJECTS),
    ),
    st.dictionaries(_KEYS, st.lists(_KEYS, max_size=2, unique=True), min_size=1, max_size=2).map(
        lambda asked: {"dependentRequired": asked}
    ),
    st.dictionaries(_KEYS, st.one_of(_LEAVES, _OBJECTS), min_size=1, max_size=2).map(
        lambda asked: {"dependentSchemas": asked}
    ),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    siblings=st.one_of(st.just({}), _OBJECTS, _LEAVES.filter(lambda leaf: isinstance(leaf, dict))),
    conditionals=st.lists(_CONDITIONALS, min_size=1, max_size=2),
    instances=st.lists(_INSTANCES, max_size=20),
)
def test_a_rewrite_accepts_exactly_what_the_schema_did(
    siblings: Any, conditionals: list[dict[str, Any]], instances: list[Any]
) -> None:
    schema = {**siblings, "allOf": conditionals}
    rewritten = exact_conditionals(schema)
    before, after = Draft202012Validator(schema), Draft202012Validator(rewritten)
    for instance in instances:
        assert before.is_valid(instance) == after.is_valid(instance), (instance, rewritten)


def test_a_ref_into_a_member_rewritten_within_its_parent_leaves_the_schema_as_sent() -> None:
    """The allOf member holds its dependency exactly only beside its parent's closed
    properties; a $ref to it from elsewhere would bring the rewrite without them."""
    schema = {
        "type": "object",
        "properties": {
            "q": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"m": {}},
                "allOf": [{"dependentRequired": {"k": ["n"]}}],
            },
            "p": {"$ref": "#/properties/q/allOf/0"},
        },
    }
    assert exact_conditionals(schema) == schema
    assert not validator(schema).is_valid({"p": {"k": 1}})


def test_a_ref_to_a_definition_still_lets_the_rest_be_rewritten() -> None:
    schema = {
        "$defs": {"kind": KIND},
        "type": "object",
        "properties": {"kind": {"$ref": "#/$defs/kind"}, "bark": {"type": "string"}},
        "dependentRequired": {"bark": ["kind"]},
    }
    assert_same(schema, [{}, {"kind": "dog", "bark": "w"}, {"bark": "w"}])


@pytest.mark.parametrize("members", [None, 5, "x"])
def test_a_node_whose_all_of_is_no_list_is_left_as_sent(members: object) -> None:
    schema = {"enum": ["a", "b", "c"], "allOf": members, "not": {"const": "a"}}
    assert exact_conditionals(schema) == schema  # refused by llguidance, never a crash


def test_nested_numbers_are_equal_values_whatever_their_spelling() -> None:
    schema = {"enum": [{"a": 1}, {"a": 2}, [1]], "not": {"enum": [{"a": 1.0}, [1.0]]}}
    assert_same(schema, [{"a": 1}, {"a": 2}, [1], {"a": 3}])


def test_repeated_refs_spend_the_proof_budget_instead_of_multiplying() -> None:
    """A hundred allOf members that each point back at the root: every step of following
    them spends the schema's shared budget, so the rewrite ends at once (1.5 s before, and
    growing with the cube of the members)."""
    schema = {"enum": [1, 2], "allOf": [{"$ref": "#"}] * 100, "not": {"const": 1}}
    rewritten = exact_conditionals(schema)  # no validator can judge it: the refs never end
    assert rewritten == schema  # the budget spent, nothing proved: `not` stays, refused by name
