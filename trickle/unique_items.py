"""``uniqueItems`` rewritten into keywords llguidance enforces, where an exact rewrite exists.

A grammar cannot compare an array's items with each other in general, and llguidance refuses
the keyword. Two shapes need no comparison:

- ``uniqueItems: false``, or an array of at most one item (``maxItems`` 0 or 1): every such
  array is unique, so the keyword is dropped;
- items drawn from a few values (an ``enum`` or ``const``, ``boolean``, ``null``): the arrays
  of distinct values are finitely many, and each of the longest is written out item by item
  (one-value ``enum``s: draft 4 has no ``const``), closed to more items: ``prefixItems`` and
  ``items: false``, or in drafts before 2020-12 (by the root's ``$schema``, which llguidance
  reads too) ``items`` as a list and ``additionalItems: false``. Every shorter array of distinct
  values is a prefix of one of them, so ``anyOf`` over those branches (the schema's own
  ``minItems`` kept) accepts exactly the unique arrays. Their number grows as k!/(k-n)!: past
  ``MAX_BRANCHES`` the keyword stays, refused by name.
"""

from __future__ import annotations

import itertools
from math import perm
from typing import Any

from trickle import schema_facts as facts
from trickle.conditionals import with_disjunctions

UNIQUE_MARKER = '"uniqueItems"'
# The most branches (arrays of the longest length) one rewrite may write.
MAX_BRANCHES = 120
# An item schema that names its values may also say only these.
_FINITE_ITEM_KEYS = frozenset({"type", "enum", "const"}) | facts.ANNOTATIONS
# Array keywords whose meaning a rewrite through ``prefixItems`` would change.
_POSITIONAL = frozenset({"prefixItems", "additionalItems", "contains", "unevaluatedItems"})
_FINITE_TYPES: dict[str, list[Any]] = {"null": [None], "boolean": [True, False]}
# ``$schema`` names of the drafts whose ``items`` takes a list (and that have no ``prefixItems``).
_LIST_ITEMS = ("draft-03", "draft-04", "draft-06", "draft-07", "draft/2019-09")
_NO_CONST = frozenset({"draft-03", "draft-04"})


def exact_unique_items(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``uniqueItems`` that can be written exactly so written."""
    dialect = facts.named_draft(schema, _LIST_ITEMS)
    rewritten = facts.rewritten_bottom_up(schema, lambda out, _sent: _rewrite(out, dialect))
    assert isinstance(rewritten, dict)
    return rewritten


def _rewrite(out: dict[str, Any], dialect: str | None) -> object:
    """One schema (its subschemas done) with its ``uniqueItems`` written where exact;
    ``dialect`` is the draft the root's ``$schema`` names, where it is one before 2020-12."""
    if "uniqueItems" not in out:
        return out
    without = facts.without(out, "uniqueItems")
    if out["uniqueItems"] is False or _at_most(out.get("maxItems"), 1):
        return without
    if out["uniqueItems"] is not True or set(out) & _POSITIONAL:
        return out
    branches = _distinct_arrays(out, dialect)
    return out if branches is None else with_disjunctions(without, [branches])


def _at_most(value: object, limit: int) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value <= limit


def _distinct_arrays(node: dict[str, Any], dialect: str | None) -> list[object] | None:
    """The longest arrays of distinct item values, one branch each (None where the items are
    not a short list of values)."""
    items = node.get("items")
    if dialect in _NO_CONST and isinstance(items, dict) and "const" in items:
        return None  # no keyword there: any item
    found = _item_values(items)
    if found is None:
        return None
    longest = len(found)
    limit = node.get("maxItems")
    if _at_most(limit, longest):
        longest = int(limit)  # type: ignore[arg-type]  # a number, _at_most said
    if perm(len(found), longest) > MAX_BRANCHES:
        return None
    listed, rest = ("prefixItems", "items") if dialect is None else ("items", "additionalItems")
    return [
        {listed: [{"enum": [value]} for value in order], rest: False}
        for order in itertools.permutations(found, longest)
    ]


def _item_values(items: object) -> list[Any] | None:
    """The distinct values an item schema allows, where it lists them (``enum``, ``const``, or
    the types ``boolean`` and ``null``), filtered by its ``type``."""
    if not isinstance(items, dict) or not set(items) <= _FINITE_ITEM_KEYS:
        return None
    kinds = facts.types([items])
    listed = facts.values([items])
    if listed is None:
        if kinds is None or not kinds <= set(_FINITE_TYPES):
            return None
        listed = [value for kind in sorted(kinds) for value in _FINITE_TYPES[kind]]
    said = items.get("type")
    named = [said] if isinstance(said, str) else said
    if "type" in items and not isinstance(named, list):
        return None
    distinct: dict[str, Any] = {}
    for value in listed:
        if named is None or any(_is_type(value, kind) for kind in named):
            distinct.setdefault(facts.value_key(value), value)
    return list(distinct.values())


def _is_type(value: object, kind: object) -> bool:
    """Whether ``value`` is of JSON Schema type ``kind`` (1.0 is an integer)."""
    if kind == "integer":
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and float(value).is_integer()  # type: ignore[arg-type]
    return facts.type_of(value) == kind
