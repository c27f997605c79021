"""``if``/``then``/``else``, ``not`` and property dependencies rewritten as ``anyOf`` / ``allOf``,
exactly where that can be done, so llguidance (which has none of them) can enforce them.

- ``dependentRequired`` / ``dependencies`` with a list, ``{"k": ["a", "b"]}``: "k absent, or a
  and b present": ``anyOf: [{"properties": {"k": false}}, {"required": ["a", "b"]}]``;
- ``dependentSchemas`` / ``dependencies`` with a schema: "k absent, or the schema holds";
- ``if: I, then: T, else: E``: ``anyOf: [allOf [I, T], allOf [not I, E]]``;
- ``not: S``: its complement;

where "absent" and "not" are written without ``not`` by ``trickle.negation``: where the ``if``
is decided by a discriminator (a ``const`` or ``enum`` the enclosing schema lists the other
values of, ``required`` keys, a ``type``). Every rewrite accepts exactly the instances the
keyword did; where no exact one exists the keyword is kept, and llguidance's refusal names it.
``dependencies`` is read as drafts 4-7 define it (2019-09 split it in two and dropped the name):
a schema that says it keeps the constraint its author meant.

A complement is taken within what the instance is known to match: the enclosing schema's
plain keywords (``type``, ``enum``, ``properties``, ``required``...), and those of every schema
around it that tests the same instance (through ``allOf``, ``anyOf``, ``oneOf``, ``not``,
``if``), so an ``if`` inside an ``allOf`` member reads the discriminator's values from the
schema holding the ``allOf``. Keywords that are rewritten here are no part of a context, so no
two rewrites lean on each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trickle import schema_facts as facts
from trickle.negation import negation
from trickle.schema_facts import Proof

# Keywords whose values are schemas the same instance is tested against.
_SAME_INSTANCE = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else"})
_DEPENDENCIES = ("dependentRequired", "dependentSchemas", "dependencies")
# Keywords rewritten here, at the schema that holds them.
_OWN = frozenset({"not", "if", "then", "else", *_DEPENDENCIES})
# Keywords whose subschemas are rewritten: never part of a context, so no two rewrites lean on
# each other.
_REWRITTEN = _SAME_INSTANCE | _OWN
# Where the schema text has none of these, there is nothing to rewrite.
MARKERS = ('"if"', '"not"', '"then"', '"else"', *(f'"{key}"' for key in _DEPENDENCIES))


def exact_conditionals(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``if``, ``not`` and dependency that can be written exactly without
    them so written; the others kept."""
    if any(_through_context(ref) for ref in _local_refs(schema)):
        # A $ref into a member rewritten within its parent's keywords would bring it where
        # they do not hold: left as sent (refused naming its keyword).
        return schema
    rewritten = _rewrite(schema, [], Proof(schema))
    # A schema nothing matches stays as sent, refused naming its keyword.
    return rewritten if isinstance(rewritten, dict) else schema


def _local_refs(node: object) -> Iterator[str]:
    """Every local ``$ref`` in the schema (data keywords' values left out)."""
    if isinstance(node, list):
        for item in node:
            yield from _local_refs(item)
    elif isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            yield ref
        for key, value in node.items():
            if key not in facts.DATA:
                yield from _local_refs(value)


def _through_context(ref: str) -> bool:
    """A pointer that passes through a keyword whose schemas are rewritten within their
    parent's (``allOf`` members, ``not``, ``if`` branches, dependencies)."""
    segments = ref.lstrip("#").strip("/").split("/")
    return any(segment in _REWRITTEN for segment in segments)


def _rewrite(node: object, context: list[object], proof: Proof) -> object:
    """``node``, rewritten; exact for instances that match every ``context`` schema."""
    if isinstance(node, list):
        return [_rewrite(item, context, proof) for item in node]
    if not isinstance(node, dict):
        return node
    if not isinstance(node.get("allOf", []), list) or not isinstance(node.get("anyOf", []), list):
        return node  # not a schema llguidance takes: refused as sent, naming it
    plain = {key: value for key, value in node.items() if key not in _REWRITTEN}
    inner = [*context, plain]
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in facts.DATA:
            out[key] = value
        elif key in _DEPENDENCIES and isinstance(value, dict):
            out[key] = {name: _rewrite(item, inner, proof) for name, item in value.items()}
        elif key in facts.SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _rewrite(item, [], proof) for name, item in value.items()}
        elif key in _SAME_INSTANCE:
            out[key] = _rewrite(value, inner, proof)
        else:
            out[key] = _rewrite(value, [], proof)
    # The node's own conditionals may also read its allOf members as sent: those are rewritten
    # without reading the conditionals, so neither rewrite leans on the other.
    members = node.get("allOf")
    own = [*inner, {"allOf": members}] if isinstance(members, list) else inner
    return _joined(out, own, proof)


def _joined(node: dict[str, Any], context: list[object], proof: Proof) -> object:
    """``node`` (its subschemas rewritten) with its own conditionals as disjunctions; False
    where one of them holds for no instance (``"a": {"not": {}}``: a must be absent)."""
    disjunctions: list[list[object]] = []
    kept: dict[str, Any] = {}
    if "not" in node:
        complement = negation(node["not"], context, proof)
        if complement is None:
            kept["not"] = node["not"]
        else:
            disjunctions.append(complement)
    if "if" in node:
        branches = _if_branches(node, context, proof)
        if branches is None:
            kept.update({key: node[key] for key in ("if", "then", "else") if key in node})
        elif branches:
            disjunctions.append(branches)
    for key in _DEPENDENCIES:
        value = node.get(key)
        if value is None:
            continue
        found = _dependencies(value, context, proof) if isinstance(value, dict) else None
        if found is None:
            kept[key] = value
        else:
            disjunctions.extend(found)
    if not all(disjunctions):
        return False
    out = {key: value for key, value in node.items() if key not in _OWN or key in kept}
    return with_disjunctions(out, disjunctions)


def _if_branches(node: dict[str, Any], context: list[object], proof: Proof) -> list[object] | None:
    """``if``/``then``/``else`` as a disjunction ([]: no constraint; None: not exactly)."""
    condition = node["if"]
    then, otherwise = (True if node.get(key, {}) == {} else node[key] for key in ("then", "else"))
    if then is True and otherwise is True:
        return []  # nothing follows from either answer
    complement = negation(condition, context, proof)
    if complement is None:
        return None
    return [_both(condition, then), *(_both(other, otherwise) for other in complement)]


def _dependencies(
    value: dict[str, Any], context: list[object], proof: Proof
) -> list[list[object]] | None:
    """Each dependency as "the key is absent, or what it asks holds" (None: not a dependency
    this can read). A key every object of the context holds asks unconditionally; one the
    context forbids, nothing."""
    context = [found for schema in context for found in facts.conjuncts(schema, proof)]
    kinds = facts.types(context)
    # Where every instance is an object that holds the key, what it asks holds unconditionally.
    required = set(facts.required(context)) if kinds is not None and kinds <= {"object"} else set()
    disjunctions: list[list[object]] = []
    for key, asked in value.items():
        if isinstance(asked, list):
            if not all(isinstance(name, str) for name in asked):
                return None
            asked = {"required": asked} if asked else True
        elif not isinstance(asked, dict | bool):
            return None
        absent = {"properties": {key: False}}
        if asked is True or asked == {} or any(facts.forbids(schema, key) for schema in context):
            continue
        if key in required:
            disjunctions.append([asked])
        else:
            disjunctions.append([absent] if asked is False else [absent, asked])
    return disjunctions


def _both(left: object, right: object) -> object:
    if right is True:
        return left
    if left is True or left == {}:
        return right
    return {"allOf": [left, right]}


def with_disjunctions(node: dict[str, Any], disjunctions: list[list[object]]) -> dict[str, Any]:
    """``node`` that also requires one schema of each disjunction: as its ``anyOf`` where it has
    none and there is one, otherwise as ``allOf`` members."""
    if not disjunctions or not isinstance(node.get("allOf", []), list):
        return node  # an allOf that is no list: left as sent, llguidance's 400 names it
    if len(disjunctions) == 1 and "anyOf" not in node:
        return {**node, "anyOf": disjunctions[0]}
    members = [
        branches[0] if len(branches) == 1 else {"anyOf": branches} for branches in disjunctions
    ]
    return {**node, "allOf": [*node.get("allOf", []), *members]}
