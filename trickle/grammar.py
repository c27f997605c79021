"""llguidance grammars for structured output: what ``GenerationParams.grammar`` carries.

The web tier builds a grammar from a request (``response_format``, ``text.format``, a forced
tool call) and checks it here, before any job exists, so a schema the engine could not enforce
is a 400 naming the field and the keyword, never a worker that stalls or answers unconstrained.

- JSON is compact (no whitespace, ``,`` and ``:`` separators): a small model steered by a mask
  can otherwise spend its whole budget on spaces and newlines between tokens.
- Never lenient: a keyword llguidance cannot enforce (``not``, ``uniqueItems``...) is refused,
  since an answer that ignores part of the schema would break the promise of ``strict``.
- Bounded: a schema over ``MAX_SCHEMA_BYTES`` is refused unread, and a compiled grammar must
  fit ``parser_limits()``, the limits the engine's matcher runs under as well.

Checked grammars are cached per schema text (an LRU), since clients send one schema many times.
Tool-call grammars are in ``trickle.tool_grammar``.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from llguidance import LLMatcher, LLParserLimits

if TYPE_CHECKING:  # a TypedDict of the type stubs only
    from llguidance._lib import JsonCompileOptions

# Larger schemas are refused before compiling: compile time grows with them (about 1 ms per
# KiB on one core), and the web tier compiles on the request's thread.
MAX_SCHEMA_BYTES = 32 * 1024
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

_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \["([^"]+)"')
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (\S+)")
_NAMED_KEY = re.compile(r"for '([A-Za-z$][\w$-]*)'")
# llguidance's messages that name no keyword, by the keyword they are about.
_KEYWORD_HINTS = (
    ("Pointer", "$ref"),
    ("regex", "pattern"),
    ("Invalid type", "type"),
    ("too large", "size"),
    ("fuel", "size"),
    ("limit", "size"),
)


class GrammarError(ValueError):
    """A schema that cannot become a grammar: ``field`` is where the request put it, ``keyword``
    the JSON Schema keyword at fault (None when no single one is)."""

    def __init__(self, field: str, keyword: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.keyword = keyword
        self.message = message


def parser_limits() -> LLParserLimits:
    """Bounds on a grammar's size and on the lexer's work: modest, so that compiling or masking
    a hostile schema fails fast instead of holding a worker's batch. The engine's matcher takes
    the same ones."""
    return LLParserLimits(
        max_items_in_row=2_000,
        initial_lexer_fuel=200_000,
        step_lexer_fuel=200_000,
        step_max_items=50_000,
        max_lexer_states=50_000,
        max_grammar_size=100_000,
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
    answer writes properties in), checked for shape and size."""
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
    size = len(text.encode())
    if size > MAX_SCHEMA_BYTES:
        raise GrammarError(
            field,
            None,
            f"{field} is {size} bytes as compact JSON; the limit is {MAX_SCHEMA_BYTES}",
        )
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
        raise GrammarError(field, None, f"{field} is not a valid JSON Schema: {exc}") from None
    check_grammar(grammar, field)
    return grammar


def check_grammar(grammar: str, field: str) -> None:
    """``GrammarError`` unless llguidance compiles ``grammar`` within ``parser_limits()``."""
    failed, messages = LLMatcher.validate_grammar_with_warnings(
        grammar, None, limits=parser_limits()
    )
    if failed:
        raise schema_error(field, messages[0] if messages else "")


def schema_error(field: str, message: str) -> GrammarError:
    """llguidance's complaint as a ``GrammarError``: the keyword it names, in a message for
    the client (its first line; the rest is grammar source)."""
    first = message.strip().splitlines()[0] if message.strip() else "cannot be compiled"
    first = first.removeprefix("failed to compile JSON schema: ")
    unimplemented = _UNIMPLEMENTED.search(message)
    if unimplemented is not None:
        keyword = unimplemented.group(1)
        return GrammarError(
            field,
            keyword,
            f"{field}: JSON Schema keyword {keyword!r} cannot be enforced by constrained "
            "decoding (see docs/structured-output.md for the keywords that can)",
        )
    if "oneOf constraints are not supported" in message:
        return GrammarError(
            field,
            "oneOf",
            f"{field}: JSON Schema keyword 'oneOf' is enforced only where no answer can match "
            "two of its branches; these may overlap (anyOf would accept them)",
        )
    unknown_format = _UNKNOWN_FORMAT.search(message)
    if unknown_format is not None:
        return GrammarError(
            field,
            "format",
            f"{field}: JSON Schema keyword 'format' value {unknown_format.group(1)!r} cannot be "
            "enforced by constrained decoding (see docs/structured-output.md for the formats "
            "that can)",
        )
    keyword = _keyword_of(message)
    if keyword == "size":
        return GrammarError(
            field, None, f"{field} is too large or complex to enforce within the grammar limits"
        )
    about = f" (keyword {keyword!r})" if keyword else ""
    return GrammarError(field, keyword, f"{field} is not a valid JSON Schema{about}: {first}")


def _keyword_of(message: str) -> str | None:
    named = _NAMED_KEY.search(message)
    if named is not None:
        return named.group(1)
    for hint, keyword in _KEYWORD_HINTS:
        if hint in message:
            return keyword
    return None


def lark_json(schema_json: str) -> str:
    """A schema (compact JSON text) as the body of a Lark ``%json`` rule, with the compact
    options that ``grammar_from_json_schema`` would apply."""
    schema: dict[str, Any] = json.loads(schema_json)
    return json.dumps({**schema, "x-guidance": COMPACT}, separators=(",", ":"))
