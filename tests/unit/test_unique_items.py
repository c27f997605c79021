"""``uniqueItems`` rewritten exactly where it can be: dropped where every array is unique, and
as the arrays of distinct values where the items take a few. jsonschema judges the schema as
sent and the rewrite (in the draft the rewrite is written for), on hand-picked and generated
instances, and the grammar on the demo model's vocabulary; the other shapes are kept, for
llguidance to refuse by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft4Validator, Draft7Validator, Draft202012Validator

from tests.llg_tokenizer import llg_tokenizer, matches
from trickle.grammar import GrammarError, json_schema_grammar
from trickle.unique_items import MAX_BRANCHES, exact_unique_items

FIELD = "response_format.json_schema.schema"
DRAFTS = {
    "http://json-schema.org/draft-04/schema#": Draft4Validator,
    "http://json-schema.org/draft-07/schema#": Draft7Validator,
}


def judge(schema: dict[str, Any]) -> Any:
    return DRAFTS.get(schema.get("$schema", ""), Draft202012Validator)(schema)


def same_verdicts(schema: dict[str, Any], instances: list[Any]) -> dict[str, Any]:
    rewritten = exact_unique_items(schema)
    assert "uniqueItems" not in json.dumps(rewritten), rewritten
    before, after = judge(schema), judge(rewritten)
    for instance in instances:
        assert after.is_valid(instance) == before.is_valid(instance), (instance, rewritten)
    return rewritten


ARRAYS = [[], ["a"], ["a", "a"], ["a", "b"], ["b", "a", "c"], ["c", "c", "a"], [1, 1.0], [1, True]]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "uniqueItems": False},
        {"type": "array", "uniqueItems": True, "maxItems": 1},
        {"type": "array", "uniqueItems": True, "maxItems": 0, "items": {"type": "string"}},
    ],
)
def test_where_every_array_is_unique_the_keyword_is_dropped(schema: dict[str, Any]) -> None:
    assert same_verdicts(schema, ARRAYS) == {
        key: value for key, value in schema.items() if key != "uniqueItems"
    }


@pytest.mark.parametrize("dialect", [None, *DRAFTS])
@pytest.mark.parametrize(
    "items",
    [
        {"enum": ["a", "b", "c"]},
        {"type": "string", "enum": ["a", "b", 1]},
        {"type": "boolean"},
        {"type": ["boolean", "null"]},
        {"enum": [1, 1.0, True, None]},
        {"type": "integer", "enum": [1, 1.5, 2.0]},
        {"enum": [[1], {"a": 1}, [1.0]]},
        {"const": "a"},
    ],
)
def test_arrays_of_a_few_values_are_listed_as_their_distinct_orders(
    dialect: str | None, items: dict[str, Any]
) -> None:
    schema: dict[str, Any] = {"type": "array", "items": items, "uniqueItems": True}
    if dialect is not None:
        schema["$schema"] = dialect
    if "draft-04" in (dialect or "") and "const" in items:
        assert exact_unique_items(schema) == schema  # draft 4 has no const: any item
        return
    extra = [[True, False], [None, True, False], [False, False], [1, 2], [2.0, 1], [[1], [1.0]]]
    same_verdicts(schema, [*ARRAYS, *extra, [{"a": 1}, [1]], [None, None], "a", None])


def test_integers_past_two_to_the_53_stay_distinct() -> None:
    big = 2**53
    schema: dict[str, Any] = {
        "type": "array",
        "items": {"enum": [big, big + 1]},
        "uniqueItems": True,
    }
    same_verdicts(schema, [[big + 1], [big, big + 1], [big + 1, big + 1], [float(big), big]])


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "uniqueItems": True},
        {"type": "array", "uniqueItems": True, "items": {"type": "string"}},
        {"type": "array", "uniqueItems": True, "items": {"enum": list(range(6))}},
        {"uniqueItems": True, "items": {"enum": [1, 2]}, "prefixItems": [{"const": 1}]},
        {"uniqueItems": True, "items": {"enum": [1, 2], "minimum": 2}},
    ],
)
def test_other_unique_arrays_are_kept_and_refused_by_name(schema: dict[str, Any]) -> None:
    assert exact_unique_items(schema) == schema
    with pytest.raises(GrammarError) as raised:
        json_schema_grammar(schema, FIELD)
    assert raised.value.keyword == "uniqueItems"


def test_the_cap_counts_the_longest_arrays() -> None:
    """Six values held to three items: 120 orders, within the cap; four items would be 360."""
    schema = {"uniqueItems": True, "items": {"enum": list(range(6))}, "maxItems": 3}
    assert len(exact_unique_items(schema)["anyOf"]) == 120 == MAX_BRANCHES
    assert exact_unique_items({**schema, "maxItems": 4}) == {**schema, "maxItems": 4}


_VALUES = st.sampled_from([0, 1, 1.0, True, False, None, "a", "b", [1], {"k": 1}])


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    values=st.lists(_VALUES, max_size=4),
    bounds=st.tuples(st.none() | st.integers(0, 4), st.none() | st.integers(0, 4)),
    beside=st.sampled_from([{}, {"anyOf": [{"minItems": 2}, {"maxItems": 0}]}]),
    instances=st.lists(st.lists(_VALUES, max_size=5), max_size=20),
)
def test_a_rewrite_accepts_exactly_the_unique_arrays(
    values: list[Any],
    bounds: tuple[int | None, int | None],
    beside: dict[str, Any],
    instances: list[list[Any]],
) -> None:
    schema: dict[str, Any] = {"type": "array", "items": {"enum": values}, "uniqueItems": True}
    for key, bound in zip(("minItems", "maxItems"), bounds, strict=True):
        if bound is not None:
            schema[key] = bound
    same_verdicts({**schema, **beside}, instances)


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> llguidance.LLTokenizer:
    return llg_tokenizer(demo_model_dir / "tokenizer.model")


@pytest.mark.parametrize("dialect", [None, "http://json-schema.org/draft-04/schema#"])
def test_the_grammar_writes_only_unique_arrays(
    tokenizer: llguidance.LLTokenizer, dialect: str | None
) -> None:
    schema: dict[str, Any] = {
        "type": "array",
        "items": {"enum": ["a", "b", "c"]},
        "uniqueItems": True,
        "minItems": 1,
    }
    if dialect is not None:
        schema["$schema"] = dialect
    grammar = json_schema_grammar(schema, FIELD)
    checker = judge(schema)
    for instance in [*ARRAYS, ["c", "b", "a"], ["a", "b", "c", "a"]]:
        text = json.dumps(instance, separators=(",", ":"))
        assert matches(tokenizer, grammar, text) == checker.is_valid(instance), instance
