"""llguidance's complaints about a schema as ``GrammarError``s that name the keyword or bound.

A refusal tells the client what to change: the JSON Schema keyword constrained decoding cannot
enforce (``not``, a look-around in a ``pattern``, a remote ``$ref``), or the bound a schema went
past (``max_grammar_size``...). A schema is called invalid only where llguidance's message
means it is (a ``$ref`` to nothing, a ``type`` that is no type, a regex that does not parse):
a valid schema that uses something unsupported is told so, by name.
"""

from __future__ import annotations

import re

_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[([^\]]*)\]")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (\S+)")
_NAMED_KEY = re.compile(r"for '([A-Za-z$][\w$-]*)'")
_LIMIT = re.compile(r"\(limit for this grammar: (\d+)\)")

# Messages about a keyword llguidance does not support in that use: (text, keyword, why).
_UNSUPPORTED = (
    (
        "oneOf constraints are not supported",
        "oneOf",
        "is enforced only where no answer can match two of its branches (a const or enum "
        "discriminator, different types, a required key another closed branch forbids) or "
        "where each branch's overlap with the others can be excluded exactly; these may "
        "overlap",
    ),
    (
        "min/maxProperties only supported",
        "minProperties",
        "(or 'maxProperties') is enforced only where every listed property is required",
    ),
    (
        "circular references with sibling keys",
        "$ref",
        "is enforced where it recurses, but not beside other keywords in the same schema",
    ),
    (
        "is not present in a registry",
        "$ref",
        "is resolved only within the schema (#/...); remote schemas are not fetched",
    ),
    ("look-around", "pattern", "uses look-around, which constrained decoding cannot enforce"),
    ("backreference", "pattern", "uses a backreference, which constrained decoding cannot enforce"),
    (
        "are not disjoint",
        "patternProperties",
        "is enforced only where no property name matches two of its patterns",
    ),
    (
        "intersection stack level exceeded",
        "allOf",
        "nests intersections deeper than constrained decoding can combine",
    ),
)
# Messages that do mean an invalid schema, by the keyword at fault.
_INVALID = (
    ("Pointer", "$ref"),
    ("Invalid URI reference", "$ref"),
    ("regex parse error", "pattern"),
    ("Invalid type", "type"),
)
# llguidance's bounds, by its message: (text, bound's name).
_BOUNDS = (
    ("grammar size (number of symbols) too big", "max_grammar_size"),
    ("initial lexer configuration (grammar) too big", "initial_lexer_fuel"),
    ("schema too large", "llguidance's JSON Schema size limit"),
)


class GrammarError(ValueError):
    """A schema that cannot become a grammar: ``field`` is where the request put it, ``keyword``
    the JSON Schema keyword at fault (None when no single one is)."""

    def __init__(self, field: str, keyword: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.keyword = keyword
        self.message = message


def schema_error(field: str, message: str, schema_text: str = "") -> GrammarError:
    """llguidance's complaint as a ``GrammarError``: the keyword or bound it names, in a message
    for the client (its first line; the rest is grammar source)."""
    first = message.strip().splitlines()[0] if message.strip() else "cannot be compiled"
    first = first.removeprefix("failed to compile JSON schema: ")
    unimplemented = _UNIMPLEMENTED.search(message)
    if unimplemented is not None:
        named = re.findall(r'"([^"]+)"', unimplemented.group(1))
        keyword = "if" if "if" in named else (named[0] if named else "unknown")
        return _unsupported(field, keyword, "cannot be enforced by constrained decoding")
    for text, keyword, why in _UNSUPPORTED:
        if text in message:
            only_max = '"maxProperties"' in schema_text and '"minProperties"' not in schema_text
            if keyword == "minProperties" and only_max:
                keyword, why = "maxProperties", why.replace("(or 'maxProperties')", "")
            return _unsupported(field, keyword, why.replace("  ", " "))
    unknown_format = _UNKNOWN_FORMAT.search(message)
    if unknown_format is not None:
        return GrammarError(
            field,
            "format",
            f"{field}: JSON Schema keyword 'format' value {unknown_format.group(1)!r} cannot be "
            "enforced by constrained decoding (see docs/structured-output.md for the formats "
            "that can)",
        )
    for text, bound in _BOUNDS:
        if text in message:
            limit = _LIMIT.search(message)
            at = f" ({limit.group(1)})" if limit else ""
            return GrammarError(
                field,
                None,
                f"{field} is past the bound {bound}{at}: too large or complex to "
                "enforce (see docs/structured-output.md, Bounds)",
            )
    for text, keyword in _INVALID:
        if text in message:
            return GrammarError(
                field, keyword, f"{field} is not a valid JSON Schema (keyword {keyword!r}): {first}"
            )
    named_key = _NAMED_KEY.search(message)
    if named_key is not None:  # a keyword's value of the wrong kind ("minimum": "x")
        keyword = named_key.group(1)
        return GrammarError(
            field, keyword, f"{field} is not a valid JSON Schema (keyword {keyword!r}): {first}"
        )
    return GrammarError(field, None, f"{field} cannot be enforced by constrained decoding: {first}")


def _unsupported(field: str, keyword: str, why: str) -> GrammarError:
    return GrammarError(
        field,
        keyword,
        f"{field}: JSON Schema keyword {keyword!r} {why} (see docs/structured-output.md for "
        "what can be enforced)",
    )
