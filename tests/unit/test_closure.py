"""The closing completion: from any prefix of a schema's answer, the tokens that make it parse
and validate (what the engine appends when max_tokens would cut a constrained answer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import pytest

from trickle.closure import Closer
from trickle.grammar_matcher import MatcherCache
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
ANSWER = '{"name":"Ada } ] Lovelace","age":36,"tags":["math","engines"],"pet":{"kind":"cat"}}'


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> SentencePieceTokenizer:
    return SentencePieceTokenizer(demo_model_dir / "tokenizer.model")


@pytest.fixture(scope="module")
def matchers(tokenizer: SentencePieceTokenizer) -> MatcherCache:
    return MatcherCache(tokenizer)


def grammar(schema: dict[str, Any]) -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(
        schema, defaults={"whitespace_flexible": False}
    )


def test_every_prefix_of_an_answer_closes_into_a_valid_instance(
    tokenizer: SentencePieceTokenizer, matchers: MatcherCache
) -> None:
    closer = Closer(tokenizer.token_bytes())
    vocabulary = tokenizer.token_bytes()
    ids = tokenizer.encode_text(ANSWER)
    for cut in range(len(ids)):
        matcher = matchers.matcher(grammar(PERSON))
        assert matcher.try_consume_tokens(ids[:cut]) == cut
        closing = closer.closing(matcher)
        assert closing is not None, f"no closing after {cut} tokens"
        text = b"".join(vocabulary[i] for i in [*ids[:cut], *closing]).decode()
        jsonschema.validate(json.loads(text), PERSON)
        assert matcher.try_consume_tokens(ids[cut:]) == len(ids) - cut  # left unchanged


def test_a_closing_completion_is_short(
    tokenizer: SentencePieceTokenizer, matchers: MatcherCache
) -> None:
    closer = Closer(tokenizer.token_bytes())
    matcher = matchers.matcher(grammar(PERSON))
    matcher.try_consume_tokens(tokenizer.encode_text('{"name":"Ada","age":3'))
    vocabulary = tokenizer.token_bytes()
    closing = closer.closing(matcher) or []
    # What is still owed: the required tags with their one item, and the brackets.
    assert b"".join(vocabulary[i] for i in closing) == b',"tags":[""]}'


def test_a_complete_answer_needs_no_closing(
    tokenizer: SentencePieceTokenizer, matchers: MatcherCache
) -> None:
    matcher = matchers.matcher(grammar(PERSON))
    matcher.try_consume_tokens(tokenizer.encode_text(ANSWER))
    assert Closer(tokenizer.token_bytes()).closing(matcher) == []


def test_encode_text_spells_exactly_the_text(tokenizer: SentencePieceTokenizer) -> None:
    vocabulary = tokenizer.token_bytes()
    for text in ["{", ' {"a": 1}', "  two spaces", "héllo", "", "\n[1,2]"]:
        assert b"".join(vocabulary[i] for i in tokenizer.encode_text(text)) == text.encode()
