"""Formats rewritten into bounds and patterns: each rewrite accepts exactly what the format
means, on hand-picked and generated instances. jsonschema judges the schema as sent, with a
format checker that knows OpenAPI's integers (their published definition), ``byte`` (RFC 4648,
by ``binascii``'s strict decoder) and the URI and IRI references (by ``jsonschema_rs``, whose
checks are RFC 3986's and 3987's; Python's jsonschema needs ``rfc3987`` for them); the rewrite
is judged without formats, and as a grammar on the demo model's vocabulary."""

from __future__ import annotations

import binascii
import json
import re
from pathlib import Path
from typing import Any

import jsonschema_rs
import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft4Validator, Draft202012Validator, FormatChecker

from tests.llg_tokenizer import llg_tokenizer, matches
from trickle.formats import INTEGER_RANGES, STRING_PATTERNS, exact_formats, unchecked_formats
from trickle.grammar import GrammarError, json_schema_grammar

FIELD = "response_format.json_schema.schema"
CHECKER = FormatChecker()


def _integer_check(low: int, high: int) -> Any:
    def check(instance: object) -> bool:
        if not isinstance(instance, int | float) or isinstance(instance, bool):
            return True
        return float(instance).is_integer() and low <= instance <= high

    return check


for _name, (_low, _high) in INTEGER_RANGES.items():
    CHECKER.checks(_name)(_integer_check(_low, _high))


def _base64(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    if len(instance) % 4:  # padded to whole quanta (RFC 4648 3.2); binascii takes "0000="
        return False
    try:
        binascii.a2b_base64(instance.encode("ascii"), strict_mode=True)
    except (ValueError, UnicodeEncodeError):
        return False
    return True


CHECKER.checks("byte")(_base64)


def _rust_check(name: str) -> Any:
    judge = jsonschema_rs.validator_for({"format": name}, validate_formats=True)
    return judge.is_valid


for _name in ("uri-reference", "iri", "iri-reference", "json-pointer", "relative-json-pointer"):
    CHECKER.checks(_name)(_rust_check(_name))


def same_verdicts(schema: dict[str, Any], instances: list[Any], draft: Any = None) -> None:
    kind = draft or Draft202012Validator
    rewritten = exact_formats(schema)
    assert "format" not in json.dumps(rewritten), rewritten
    before, after = kind(schema, format_checker=CHECKER), kind(rewritten)
    for instance in instances:
        assert after.is_valid(instance) == before.is_valid(instance), (instance, rewritten)


_INT32 = INTEGER_RANGES["int32"]
NUMBERS = [
    0,
    1,
    -1,
    1.5,
    1.0,
    *_INT32,
    _INT32[0] - 1,
    _INT32[1] + 1,
    2**40,
    255,
    256,
    -129,
    2**32 - 1,
    2**32,
    "1",
    None,
    True,
]


@pytest.mark.parametrize("name", sorted(INTEGER_RANGES))
@pytest.mark.parametrize(
    "kind", ["integer", "number", ["integer", "null"], ["number", "string"], None]
)
def test_an_integer_format_holds_numbers_to_its_range(name: str, kind: Any) -> None:
    schema: dict[str, Any] = {"format": name} if kind is None else {"type": kind, "format": name}
    same_verdicts(schema, NUMBERS)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "format": "int32", "minimum": 0, "maximum": 2**40},
        {"type": "integer", "format": "int8", "minimum": -1000, "exclusiveMaximum": 100},
        {"type": "number", "format": "uint16", "multipleOf": 5},
        {"format": "int16", "maximum": 3},
    ],
)
def test_an_integer_format_is_intersected_with_the_schemas_own_bounds(
    schema: dict[str, Any],
) -> None:
    same_verdicts(schema, [*NUMBERS, 5, 10, 99, 100, 3, 4, 65535, 65540])


@pytest.mark.parametrize(
    ("schema", "instances"),
    [
        # Draft 4's boolean exclusiveMinimum qualifies the schema's own minimum only.
        ({"type": "integer", "format": "int8", "minimum": -500, "exclusiveMinimum": True}, []),
        ({"type": "integer", "format": "int8", "minimum": -128, "exclusiveMinimum": True}, []),
        ({"type": "integer", "format": "int8", "minimum": 3, "exclusiveMinimum": True}, []),
        ({"type": "integer", "format": "uint8", "exclusiveMaximum": True}, []),
    ],
)
def test_draft_4_exclusive_flags_stay_with_the_bound_they_qualify(
    schema: dict[str, Any], instances: list[Any]
) -> None:
    same_verdicts(schema, [*NUMBERS, -128, -127, 3, 4, 127, 128], Draft4Validator)


@pytest.mark.parametrize("name", ["int32", "int64", "double", "float", "uint64"])
def test_a_numeric_format_on_a_schema_that_is_no_number_is_dropped(name: str) -> None:
    assert exact_formats({"type": ["string", "null"], "format": name}) == {
        "type": ["string", "null"]
    }


@pytest.mark.parametrize("name", ["int64", "uint64", "double", "float"])
def test_a_numeric_format_without_an_exact_range_is_kept(name: str) -> None:
    """llguidance reads bounds through a double: -2**63 fails and 2**64 - 1 is cut, and a
    double's range is no range it can write; kept, so untyped it is refused by name."""
    assert exact_formats({"format": name}) == {"format": name}
    with pytest.raises(GrammarError) as raised:
        json_schema_grammar({"format": name}, FIELD)
    assert raised.value.keyword == "format"


STRINGS = [
    "",
    "AAAA",
    "AAB=",
    "AA==",
    "A===",
    "AAA",
    "AA==AA==",
    "a b",
    "//host:80/a/b?q=1#f",
    "http://user@[::1]:8080/p?q#frag",
    "http://[::ffff:1.2.3.4]/",
    "http://[v1.x]/",
    "http://[1:2]/",
    "mailto:a@b.c",
    "./a:b",
    "a:b",
    ":a",
    "%zz",
    "%41",
    "/a/%41",
    "#",
    "?",
    "http://é.example/ß?\ue000",
    "/ß#\ue000",
    "http://x/\x7f",
    "urn:isbn:0451450523",
    "x://a]b",
    "/a~1b/~0",
    "/a~2",
    "0#",
    "1/a",
    "01/a",
    "2/~",
    '/a"b\\c',
]


@pytest.mark.parametrize("name", sorted(STRING_PATTERNS))
@pytest.mark.parametrize("kind", ["string", ["string", "null"], None])
def test_a_string_format_is_its_pattern(name: str, kind: Any) -> None:
    schema: dict[str, Any] = {"format": name} if kind is None else {"type": kind, "format": name}
    same_verdicts(schema, [*STRINGS, None, 1])


def test_a_format_pattern_goes_beside_the_schemas_own() -> None:
    schema = {"type": "string", "format": "byte", "pattern": "^A"}
    rewritten = exact_formats(schema)
    assert rewritten["pattern"] == "^A" and len(rewritten["allOf"]) == 1
    same_verdicts(schema, STRINGS)


def test_a_property_called_format_is_no_keyword() -> None:
    schema = {"properties": {"format": {"type": "string"}}, "enum": [{"format": "byte"}]}
    assert exact_formats(schema) == schema


_URI_ALPHABET = st.sampled_from(
    [*"aZ09-._~!$&'()*+,;=:@/?#[]% ", "%4", "%41", "//", "é", "\ue000", "::", "1.2.3.4"]
)


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(text=st.lists(_URI_ALPHABET, max_size=12).map("".join))
def test_the_reference_patterns_match_what_rfc_3986_and_3987_accept(text: str) -> None:
    for name in ("uri-reference", "iri", "iri-reference"):
        expected = CHECKER.conforms(text, name)
        assert bool(re.search(STRING_PATTERNS[name], text)) == expected, (name, text)


@settings(max_examples=800, deadline=None, derandomize=True)
@given(text=st.text(alphabet="AZaz09+/=-_ ", max_size=10))
def test_the_byte_pattern_matches_what_rfc_4648_decodes(text: str) -> None:
    assert bool(re.search(STRING_PATTERNS["byte"], text)) == CHECKER.conforms(text, "byte")


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> llguidance.LLTokenizer:
    return llg_tokenizer(demo_model_dir / "tokenizer.model")


GRAMMAR_CASES: list[tuple[dict[str, Any], list[Any]]] = [
    ({"type": "integer", "format": "int32"}, [0, *_INT32, _INT32[0] - 1, _INT32[1] + 1]),
    ({"type": ["number", "null"], "format": "uint8"}, [0, 255, 256, -1, None, 7]),
    ({"type": "string", "format": "byte", "maxLength": 8}, ["", "AAAA", "AA==", "A===", "AAA"]),
    ({"type": "string", "format": "uri-reference"}, STRINGS),
    ({"type": "string", "format": "iri"}, STRINGS),
    ({"type": "string", "format": "json-pointer"}, STRINGS),
    ({"type": "string", "format": "relative-json-pointer"}, STRINGS),
    ({"type": "string", "format": "int64"}, ["12", "x"]),
]


@pytest.mark.parametrize(("schema", "instances"), GRAMMAR_CASES)
def test_the_grammar_matches_what_the_format_means(
    tokenizer: llguidance.LLTokenizer, schema: dict[str, Any], instances: list[Any]
) -> None:
    grammar = json_schema_grammar(schema, FIELD)
    judge = Draft202012Validator(schema, format_checker=CHECKER)
    for instance in instances:
        text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
        assert matches(tokenizer, grammar, text) == judge.is_valid(instance), instance


@pytest.mark.parametrize("name", ["topic", "non-blank", "url", "DATE"])
def test_a_format_no_specification_defines_is_an_annotation_and_named(name: str) -> None:
    """JSON Schema passes every instance of a format a validator does not know: the rewrite
    drops it, and ``unchecked_formats`` names it for the client's header."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": name}}}
    assert exact_formats(schema) == {"type": "object", "properties": {"a": {"type": "string"}}}
    assert unchecked_formats(schema) == [name]
    json_schema_grammar(schema, FIELD)
    same_verdicts(schema, [{"a": text} for text in STRINGS])


def test_only_formats_no_specification_defines_are_named_unchecked() -> None:
    schema = {
        "properties": {
            "format": {"format": "topic"},  # a property called format, with a custom one
            "b": {"format": "email", "const": {"format": "in-data"}},
            "c": {"format": "password"},
        },
        "items": [{"format": "url"}, {"format": "topic"}],
    }
    assert unchecked_formats(schema) == ["topic", "url"]


def test_idn_email_is_served_as_email() -> None:
    assert exact_formats({"type": "string", "format": "idn-email"}) == {
        "type": "string",
        "format": "email",
    }
    assert unchecked_formats({"format": "idn-email"}) == []


@pytest.mark.parametrize("name", ["regex", "uri-template", "idn-hostname"])
def test_a_defined_format_that_is_not_enforced_is_refused_naming_it(name: str) -> None:
    with pytest.raises(GrammarError) as raised:
        json_schema_grammar({"type": "string", "format": name}, FIELD)
    assert raised.value.keyword == "format" and name in raised.value.message
    assert unchecked_formats({"format": name}) == []
