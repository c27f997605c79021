"""llguidance grammars for structured output: what ``GenerationParams.grammar`` carries.

The web tier builds a grammar from a request (``response_format``, ``text.format``, a forced
tool call) and checks it here, before any job exists, so a schema the engine could not enforce
is a 400 naming the field and the keyword, never a worker that stalls or answers unconstrained.

- JSON is compact (no whitespace, ``,`` and ``:`` separators): a small model steered by a mask
  can otherwise spend its whole budget on spaces and newlines between tokens.
- Never lenient: a keyword llguidance cannot enforce (``not``, ``propertyNames``...) is refused,
  since an answer that ignores part of the schema would break the promise of ``strict``.
- Bounded by llguidance's own work limits, not by a size of Trickle's: a compiled grammar must
  fit ``parser_limits()`` (the engine's matcher runs under the same ones), whose fuel bounds the
  time a compile takes and whose lexer-state cap bounds a matcher's memory; a schema past one
  is a 400 naming it. The request body's limit bounds the schema's text.
- ``oneOf`` is served where its branches are provably disjoint, or their overlaps can be
  excluded exactly, as ``anyOf`` (``trickle.one_of``); ``if``/``then``/``else``, ``not`` and
  property dependencies where they can be written exactly as ``anyOf``/``allOf``
  (``trickle.conditionals``).
- Formats llguidance does not know are written as bounds or patterns where their meaning is
  exact (``trickle.formats``), and ``uniqueItems`` as ``anyOf`` where the items take a few
  values (``trickle.unique_items``).
- ``pattern`` is generated anchored at the string's start (``trickle.patterns``): the answer
  still matches the schema as sent, and it can always be closed.

Checked grammars are cached per schema text (an LRU), since clients send one schema many times.
Tool-call grammars are in ``trickle.tool_grammar``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from llguidance import LLMatcher, LLParserLimits

from trickle.conditionals import MARKERS, exact_conditionals
from trickle.formats import FORMAT_MARKER, exact_formats
from trickle.grammar_errors import GrammarError as GrammarError
from trickle.grammar_errors import schema_error
from trickle.one_of import exclusive_one_of
from trickle.patterns import anchor_patterns
from trickle.property_names import PROPERTY_NAMES_MARKER, exact_property_names
from trickle.unique_items import UNIQUE_MARKER, exact_unique_items

if TYPE_CHECKING:  # a TypedDict of the type stubs only
    from llguidance._lib import JsonCompileOptions

CACHE_SIZE = 256
# Deeper schemas are refused unread (llguidance's own parser stops near 100 levels).
MAX_SCHEMA_DEPTH = 64

# No whitespace at all between JSON tokens; lenient off so that unknown keywords are errors.
COMPACT: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ",",
    "key_separator": ":",
    "lenient": False,
    "coerce_one_of": False,
}


def parser_limits() -> LLParserLimits:
    """llguidance's own bounds on a grammar's size and the lexer's work (its defaults, so that
    Trickle accepts every schema plain llguidance does): the fuel bounds a compile's time, the
    lexer-state cap a matcher's memory, the per-token ones a mask's time, so a hostile schema
    fails fast instead of holding a worker's batch. The engine's matcher takes the same ones;
    what they cost is measured in docs/performance.md."""
    return LLParserLimits(
        max_items_in_row=2_000,
        initial_lexer_fuel=1_000_000,
        step_lexer_fuel=200_000,
        step_max_items=50_000,
        max_lexer_states=250_000,
        max_grammar_size=500_000,
        verbose_errors=False,
    )


def json_object_grammar() -> str:
    """Any JSON object (``response_format: {"type": "json_object"}``)."""
    return json_schema_grammar({"type": "object"}, "response_format")


def json_schema_grammar(schema: object, field: str) -> str:
    """The grammar of JSON texts that ``schema`` accepts; ``GrammarError`` on ``field``
    when it cannot be enforced."""
    return schema_grammar(schema_text(schema, field), field)


def schema_text(schema: object, field: str) -> str:
    """The schema as compact JSON (the cache key: key order is kept, since it is the order the
    answer writes properties in), checked for shape and depth, its formats, ``uniqueItems``,
    conditionals and ``oneOf``s rewritten where exact and its patterns anchored at the start."""
    if not isinstance(schema, dict):
        raise GrammarError(field, None, f"{field} must be a JSON Schema object")
    if "x-guidance" in schema:
        raise GrammarError(
            field, "x-guidance", f"{field}: keyword 'x-guidance' is not accepted (engine options)"
        )
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise GrammarError(
            field, None, f"{field} nests deeper than {MAX_SCHEMA_DEPTH} objects and arrays"
        )
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if FORMAT_MARKER in text:
        schema = exact_formats(schema)
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if UNIQUE_MARKER in text:
        schema = exact_unique_items(schema)
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if PROPERTY_NAMES_MARKER in text:
        schema = exact_property_names(schema)
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if any(marker in text for marker in MARKERS):
        schema = exact_conditionals(schema)
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if '"oneOf"' in text:
        schema = exclusive_one_of(schema)
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if '"pattern"' in text:
        text = json.dumps(anchor_patterns(schema), separators=(",", ":"), ensure_ascii=False)
    return text


def _depth(value: object) -> int:
    """How deep objects and arrays nest in ``value``, counted without recursion (a body can
    nest deeper than Python's stack allows a recursive walk, or ``json.dumps``)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[object] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_SCHEMA_DEPTH:
            stack.extend((child, depth + 1) for child in children)
    return deepest


@lru_cache(maxsize=CACHE_SIZE)
def schema_grammar(text: str, field: str) -> str:
    """The grammar of a schema ``schema_text`` returned, checked (and cached)."""
    try:
        grammar = LLMatcher.grammar_from_json_schema(text, overrides=COMPACT)
    except ValueError as exc:
        raise schema_error(field, str(exc), text) from None
    check_grammar(grammar, field, text)
    return grammar


def check_grammar(grammar: str, field: str, schema_text: str = "") -> None:
    """``GrammarError`` unless llguidance compiles ``grammar`` within ``parser_limits()``."""
    failed, messages = LLMatcher.validate_grammar_with_warnings(
        grammar, None, limits=parser_limits()
    )
    if failed:
        raise schema_error(field, messages[0] if messages else "", schema_text)


def lark_json(schema_json: str) -> str:
    """A schema (compact JSON text) as the body of a Lark ``%json`` rule, with the compact
    options that ``grammar_from_json_schema`` would apply."""
    schema: dict[str, Any] = json.loads(schema_json)
    return json.dumps({**schema, "x-guidance": COMPACT}, separators=(",", ":"))
