"""Patterns anchored at the start, for generation: what keeps a constrained answer closable.

JSON Schema's ``pattern`` is unanchored: a string is valid when the pattern matches anywhere in
it, and llguidance enforces exactly that. For a model writing the string, that leaves every
character allowed until a match happens to complete, so neither the model nor the closing
search (``trickle.closure_search``: it tells states apart by their masks, all alike here) is
steered toward one: on JSONSchemaBench's ``\\d{4}-\\d{2}-\\d{2}T...`` timestamps the search
found no way out and the answer came back empty. Generating with ``^(?:pattern)`` instead
allows only strings that begin with a match: each of them contains one, so every answer is still
valid under the schema as sent, and the masks narrow from the first character. What is lost is
text before the match, which no schema requires.

Only schema keywords are rewritten: a ``pattern`` inside a value (``const``, ``enum``,
``default``, ``examples``) is data and stays as it is.
"""

from __future__ import annotations

import re
from typing import Any

# Keywords whose values are instances, not schemas: never rewritten.
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example"})
# Keywords whose values map names (a property's, a definition's) to schemas: a property named
# ``const`` holds a schema, not data.
SCHEMA_MAPS = frozenset(
    # (``dependencies``' values are schemas or lists of names: a list is walked as data)
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)


def anchored(pattern: str) -> str:
    """``pattern`` as one that must match at the string's start (``^a|b`` becomes
    ``^(?:^a|b)``, so an unanchored branch is anchored too); unchanged where wrapping could
    change its meaning rather than anchor it: one that is no regex on its own (``a)|(b``
    would become a valid one) or one in verbose mode (a trailing comment would swallow the
    closing parenthesis). One Python's ``re`` cannot read goes as sent too: llguidance (whose
    dialect is Rust's) judges it."""
    if "(?x" in pattern:
        return pattern
    try:
        re.compile(pattern)
    except (re.error, RecursionError):
        return pattern
    return f"^(?:{pattern})"


def anchor_patterns(schema: Any) -> Any:
    """A copy of ``schema`` with every ``pattern`` keyword anchored at the start."""
    if isinstance(schema, list):
        return [anchor_patterns(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    copy: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "pattern" and isinstance(value, str):
            copy[key] = anchored(value)
        elif key in DATA_KEYWORDS:
            copy[key] = value
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            copy[key] = {name: anchor_patterns(item) for name, item in value.items()}
        else:
            copy[key] = anchor_patterns(value)
    return copy
