"""The closing completion where a greedy walk circles (formats, patterns, minimum lengths): from
any state a fighting model can leave, a completion is found, and it validates, formats and
patterns included. Schemas are generated (hypothesis) besides the shapes named in
docs/structured-output.md. (hypothesis-jsonschema 0.23, which would generate their instances,
does not run on this hypothesis: its ``from_schema`` calls a ``many.more`` that is gone.)"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import llguidance
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.schema_answers import SHAPES, assert_valid, field_schema
from trickle.closure import Closer
from trickle.grammar import json_schema_grammar
from trickle.grammar_matcher import MatcherCache, allowed_mask
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> SentencePieceTokenizer:
    return SentencePieceTokenizer(demo_model_dir / "tokenizer.model")


@pytest.fixture(scope="module")
def matchers(tokenizer: SentencePieceTokenizer) -> MatcherCache:
    return MatcherCache(tokenizer)


@pytest.fixture(scope="module")
def closer(tokenizer: SentencePieceTokenizer) -> Closer:
    return Closer(tokenizer.token_bytes())


def check_answer(tokenizer: SentencePieceTokenizer, schema: dict[str, Any], ids: list[int]) -> None:
    """The answer parses and validates, formats included (the grammar took every token, and
    ended accepting, in the search that found them)."""
    assert_valid(schema, b"".join(tokenizer.token_bytes()[i] for i in ids).decode())


def fight(
    matcher: llguidance.LLMatcher, vocab_size: int, steps: int, rng: random.Random
) -> list[int]:
    """What a random-weight model leaves: ``steps`` allowed tokens drawn at random, no end."""
    taken: list[int] = []
    for _ in range(steps):
        if matcher.is_accepting():
            break
        allowed = [int(i) for i in allowed_mask(matcher, vocab_size).nonzero()[0]]
        allowed = [i for i in allowed if i != 2]  # the end token, refused before the grammar ends
        if not allowed:
            break
        token = rng.choice(allowed)
        assert matcher.try_consume_tokens([token]) == 1
        taken.append(token)
    return taken


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_fought_answer_closes_validly_where_the_greedy_walk_circles(
    shape: str, tokenizer: SentencePieceTokenizer, matchers: MatcherCache, closer: Closer
) -> None:
    schema = field_schema(SHAPES[shape])
    grammar = json_schema_grammar(schema, "response_format")
    rng = random.Random(shape)
    for steps in [5, 13, 34]:
        matcher = matchers.matcher(grammar)
        taken = fight(matcher, len(tokenizer.token_bytes()), steps, rng)
        closing = closer.closing(matcher)
        assert closing is not None, f"{shape}: no closing after {taken}"
        check_answer(tokenizer, schema, [*taken, *closing])


def test_the_email_field_that_failed_closes_at_once(
    tokenizer: SentencePieceTokenizer, matchers: MatcherCache, closer: Closer
) -> None:
    """The minimal failing case: a greedy walk kept writing ``0`` in the local part; it now
    leaves the loop by a token that changes the mask (the ``@``), and so does the search."""
    schema = field_schema(SHAPES["email"])
    matcher = matchers.matcher(json_schema_grammar(schema, "response_format"))
    prefix = tokenizer.encode_text('{"d":"ada')
    assert matcher.try_consume_tokens(prefix) == len(prefix)
    walked = closer.greedy(matcher, 512)
    assert walked is not None and len(walked) <= 16
    check_answer(tokenizer, schema, [*prefix, *walked])
    closing = closer.closing(matcher, 8)
    assert closing is not None and len(closing) <= 8
    check_answer(tokenizer, schema, [*prefix, *closing])


# Patterns of classes repeated with ``+`` (JSONSchemaBench's Snowplow and Github schemas the
# web tier refused as "no whole answer found"): where a repetition's class is the greedy walk's
# first choice, only a different byte (``.``, ``/``, ``-``) leaves it; the second field meets
# the same masks the first left by.
LOOPING = {
    "version": {"type": "string", "pattern": "\\d+\\.\\d+\\.\\d+-?.*"},
    "iglu": {
        "type": "string",
        "pattern": "^iglu:[a-zA-Z0-9-_.]+/[a-zA-Z0-9-_]+/[a-zA-Z0-9-_]+/[0-9]+-[0-9]+-[0-9]+$",
    },
    # A URL's host: no one token changes the mask (``.`` and letters stay in the repetition),
    # ``.`` and two letters do (Github_hard o82849).
    "url": {
        "type": "string",
        "pattern": "^(https?:\\/\\/)?([\\da-z\\.-]+)\\.([a-z\\.]{2,6})([\\/\\w \\.-]*)*\\/?$",
    },
}


@pytest.mark.parametrize("shape", sorted(LOOPING))
def test_the_greedy_walk_leaves_a_repetition_it_circles_in(
    tokenizer: SentencePieceTokenizer, matchers: MatcherCache, closer: Closer, shape: str
) -> None:
    schema = {
        "type": "object",
        "properties": {"a": LOOPING[shape], "b": LOOPING[shape]},
        "required": ["a", "b"],
    }
    matcher = matchers.matcher(json_schema_grammar(schema, "response_format"))
    walked = closer.greedy(matcher, 512)
    assert walked is not None and len(walked) <= 64
    check_answer(tokenizer, schema, walked)


def test_the_shortest_answer_is_searched_not_estimated(
    tokenizer: SentencePieceTokenizer, matchers: MatcherCache, closer: Closer
) -> None:
    """Shorter than the greedy walk's where it finds one, and found where it finds none."""
    for shape in SHAPES.values():
        grammar = json_schema_grammar(field_schema(shape), "response_format")
        matcher = matchers.matcher(grammar)
        greedy = closer.greedy(matcher, 512)
        shortest = closer.shortest(matcher)
        assert shortest is not None
        assert greedy is None or len(shortest) <= len(greedy)
        # No answer is shorter: the search bounded one token below finds none.
        assert closer.shortest(matcher, len(shortest) - 1) in (None, shortest)
        check_answer(tokenizer, field_schema(shape), shortest)


# Schemas of the kinds the engine enforces, nested a few levels.
_STRING = st.one_of(
    st.just({"type": "string"}),
    st.sampled_from(["email", "date-time", "time", "date", "uri", "uuid", "ipv4"]).map(
        lambda f: {"type": "string", "format": f}
    ),
    st.integers(0, 20).map(lambda n: {"type": "string", "minLength": n}),
    st.sampled_from(["^[a-z]+@[a-z]+$", "^[A-Z]{3}[0-9]{2,4}$", "^(ab|cd)+-x$"]).map(
        lambda p: {"type": "string", "pattern": p}
    ),
)
_LEAF = st.one_of(
    _STRING,
    st.just({"type": "integer", "minimum": 10, "maximum": 99}),
    st.just({"type": "boolean"}),
    st.just({"enum": ["red", "green", 7]}),
)


def _containers(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    arrays = st.builds(
        lambda items, low: {"type": "array", "items": items, "minItems": low},
        inner,
        st.integers(0, 2),
    )
    objects = st.dictionaries(st.sampled_from("abcde"), inner, min_size=1, max_size=3).map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props)}
    )
    return st.one_of(arrays, objects)


SCHEMAS = st.recursive(_LEAF, _containers, max_leaves=5).map(field_schema)


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=SCHEMAS, steps=st.integers(1, 40), seed=st.integers(0, 1 << 16))
def test_generated_schemas_close_validly_wherever_a_random_model_leaves_them(
    schema: dict[str, Any],
    steps: int,
    seed: int,
    tokenizer: SentencePieceTokenizer,
    matchers: MatcherCache,
    closer: Closer,
) -> None:
    grammar = json_schema_grammar(schema, "response_format")
    matcher = matchers.matcher(grammar)
    taken = fight(matcher, len(tokenizer.token_bytes()), steps, random.Random(seed))
    closing = closer.closing(matcher)
    assert closing is not None, (schema, taken)
    check_answer(tokenizer, schema, [*taken, *closing])


def test_an_unanchored_pattern_closes(
    tokenizer: SentencePieceTokenizer, matchers: MatcherCache, closer: Closer
) -> None:
    """JSONSchemaBench's timestamps (Github_medium o12618): unanchored, every character was
    allowed until a match completed, so no search told states apart and the answer came back
    empty. Anchored at the start for generation, the answer closes and matches as sent."""
    stamp = {"type": "string", "pattern": r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}.\d{6}"}
    schema = {
        "type": "object",
        "properties": {"created": stamp, "modified": stamp},
        "required": ["created", "modified"],
    }
    matcher = matchers.matcher(json_schema_grammar(schema, "response_format"))
    shortest = closer.shortest(matcher)
    assert shortest is not None
    check_answer(tokenizer, schema, shortest)
    fought = matchers.matcher(json_schema_grammar(schema, "response_format"))
    taken = fight(fought, len(tokenizer.token_bytes()), 9, random.Random(3))
    closing = closer.closing(fought)
    assert closing is not None
    check_answer(tokenizer, schema, [*taken, *closing])


def test_an_answer_past_the_search_is_found_by_the_walk(
    tokenizer: SentencePieceTokenizer, matchers: MatcherCache, closer: Closer
) -> None:
    """Dozens of required keys: no answer within 512 tokens. The walk's answer is one that
    exists (an upper bound, valid); what is known below it is only what the search proved."""
    keys = [f"setting_number_{i}" for i in range(64)]
    schema = {
        "type": "object",
        "properties": {key: {"type": "boolean"} for key in keys},
        "required": keys,
    }
    matcher = matchers.matcher(json_schema_grammar(schema, "response_format"))
    length = closer.answer_length(matcher)
    assert length.found is not None and length.found > 512
    assert 1 <= length.least <= length.found
    walk = closer.greedy(matcher, length.found)
    assert walk is not None and len(walk) == length.found
    check_answer(tokenizer, schema, walk)
