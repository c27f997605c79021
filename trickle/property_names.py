"""``propertyNames`` rewritten into keywords llguidance enforces, where the rewrite is exact.

llguidance refuses the keyword. Every object key is a string, and the keys an object may have
are what ``properties``, ``patternProperties`` and ``additionalProperties`` already decide, so
a ``propertyNames`` of these shapes (its own ``$ref``s followed, annotations aside) moves into
them:

- ``{"type": "string"}`` (or ``true``, ``{}``): every key is one; dropped;
- ``{"enum": [...]}`` (strings, ``type: string`` allowed): the keys are those names, each
  with the schema the object gave it (its ``properties`` entry, else its
  ``additionalProperties``; beside ``patternProperties`` only where every pattern matches every
  name, ``.*``, whose schemas it then also takes), and no other: ``properties`` and
  ``additionalProperties: false``;
- ``{"pattern": p}`` on an object with no ``properties`` or ``patternProperties``:
  ``patternProperties: {p: its additionalProperties}``, ``additionalProperties: false`` (the
  same unanchored search as ``propertyNames``' pattern).

Under a root ``$schema`` of draft 3 or 4, which have no ``propertyNames``, it is an unknown
keyword that constrains nothing, and is dropped. Any other ``propertyNames`` stays, refused by name.
"""

from __future__ import annotations

from typing import Any

from trickle import schema_facts as facts

NAMES = "propertyNames"
PROPERTY_NAMES_MARKER = f'"{NAMES}"'
# Patterns that match every key (an unanchored search: ``^.*$`` fails on a key with a newline).
_MATCH_ALL = frozenset({".*", ""})
# Drafts before ``propertyNames`` (draft 6): there it is an unknown keyword, and means nothing.
_BEFORE = ("draft-03", "draft-04")


def exact_property_names(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with each ``propertyNames`` of the shapes above written as the keywords that
    mean it."""
    if facts.named_draft(schema, _BEFORE) is not None:  # ``propertyNames`` unknown there
        rewritten = facts.rewritten_bottom_up(schema, lambda out, _: facts.without(out, NAMES))
    else:
        rewritten = facts.rewritten_bottom_up(schema, lambda out, _: _rewrite(out, schema))
    assert isinstance(rewritten, dict)
    return rewritten


def _rewrite(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    if "propertyNames" not in node:
        return node
    names = _followed(node["propertyNames"], root)
    if not isinstance(names, dict) and names is not True:
        return node
    kept = {} if names is True else {k: v for k, v in names.items() if k not in facts.ANNOTATIONS}
    if kept.pop("type", "string") not in ("string", ["string"]):
        return node
    out = facts.without(node, NAMES)
    if not kept:
        return out
    if set(kept) == {"enum"} and isinstance(kept["enum"], list):
        return _named(out, kept["enum"]) or node
    if set(kept) == {"pattern"} and isinstance(kept["pattern"], str):
        if out.get("properties") or out.get("patternProperties"):
            return node
        extra = out.get("additionalProperties", True)
        return {**out, "patternProperties": {kept["pattern"]: extra}, "additionalProperties": False}
    return node


def _named(out: dict[str, Any], names: list[object]) -> dict[str, Any] | None:
    """The object held to ``names``, each key with the schemas the object gives it."""
    if not all(isinstance(name, str) for name in names):
        return None
    patterns = out.get("patternProperties") or {}
    properties = out.get("properties") or {}
    if not isinstance(patterns, dict) or not isinstance(properties, dict):
        return None
    if any(pattern not in _MATCH_ALL for pattern in patterns):
        return None
    everyone = list(patterns.values())
    held: dict[str, Any] = {}
    for name in dict.fromkeys(names):
        assert isinstance(name, str)
        own = properties.get(name)
        schemas = [own, *everyone] if own is not None else everyone
        if not schemas:
            schemas = [out.get("additionalProperties", True)]
        held[name] = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
    rest = facts.without(out, "patternProperties")
    return {**rest, "properties": held, "additionalProperties": False}


def _followed(schema: object, root: dict[str, Any]) -> object:
    """``schema`` with a ``$ref`` that is all it says (but annotations) replaced by its target,
    transitively; a ``$ref`` it cannot follow (remote, or a cycle) leaves it as it is."""
    seen: set[str] = set()
    while isinstance(schema, dict) and set(schema) - facts.ANNOTATIONS == {"$ref"}:
        ref = schema["$ref"]
        if not isinstance(ref, str) or ref in seen:
            return schema
        seen.add(ref)
        target = facts.resolve(ref, root)
        if target is None:
            return schema
        schema = target
    return schema
