"""``oneOf`` as ``anyOf`` where no instance can match two branches, so llguidance can enforce it.

llguidance refuses ``oneOf`` (an answer must match exactly one branch, which a grammar cannot
check); ``anyOf`` it enforces. The two accept the same instances when the branches are
pairwise disjoint, which most real schemas' ``oneOf`` are by construction: a ``const`` or
``enum`` discriminator property, branches of different types, or a required key that another,
closed branch does not allow. Those are proved here from the schema alone, conservatively:
a pair not proved disjoint keeps its ``oneOf``, and llguidance's refusal names the keyword.

A branch is read as the conjunction of the schemas an instance must match: the branch itself,
its local ``$ref`` targets, its ``allOf`` members, and the ``oneOf``'s own siblings (the
enclosing schema's ``type``, ``properties`` and ``required`` hold for every branch).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

# Keywords whose values are data, not schemas: never rewritten.
_DATA = frozenset({"const", "enum", "default", "examples"})
# Keywords whose values map names to schemas (a property may be called "enum").
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
# What a branch that only requires one key may also say.
_ONE_KEY_BRANCH = frozenset({"required", "title", "description", "$comment"})
# How far $ref, allOf and nested properties are followed when proving two branches disjoint,
# and how many comparisons one schema's proofs may make (a hostile schema's stay bounded: past
# it, no more oneOf is proved disjoint).
_REACH = 6
_STEPS = 20_000


class _Proof:
    """The schema the proofs read ``$ref``s in, and the comparisons left to them."""

    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.steps = _STEPS


def exclusive_one_of(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with each ``oneOf`` whose branches are provably disjoint as ``anyOf`` (or as an
    ``allOf`` member holding the ``anyOf``, beside an ``anyOf`` of its own)."""
    rewritten = _rewrite(schema, _Proof(schema))
    assert isinstance(rewritten, dict)
    return rewritten


def _rewrite(node: object, proof: _Proof) -> object:
    if isinstance(node, list):
        return [_rewrite(item, proof) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DATA:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _rewrite(item, proof) for name, item in value.items()}
        else:
            out[key] = _rewrite(value, proof)
    branches = out.get("oneOf")
    if not isinstance(branches, list):
        return out
    if not _pairwise_disjoint(branches, node, proof):
        branches = _one_key_each(branches, node, proof)
        if branches is None:
            return out
        out["oneOf"] = branches
    if "anyOf" not in out:
        return {("anyOf" if key == "oneOf" else key): value for key, value in out.items()}
    del out["oneOf"]
    out["allOf"] = [*out.get("allOf", []), {"anyOf": branches}]
    return out


def _pairwise_disjoint(branches: list[Any], parent: dict[str, Any], proof: _Proof) -> bool:
    siblings = _siblings(parent)
    conjunctions = [
        [*_conjuncts(branch, proof, 0), *_conjuncts(siblings, proof, 0)] for branch in branches
    ]
    return all(
        _disjoint(conjunctions[i], conjunctions[j], proof, 0)
        for i in range(len(conjunctions))
        for j in range(i + 1, len(conjunctions))
    )


def _siblings(parent: dict[str, Any]) -> dict[str, Any]:
    """What the schema around a ``oneOf`` says of every branch."""
    return {key: value for key, value in parent.items() if key not in ("oneOf", "anyOf")}


def _one_key_each(branches: list[Any], parent: dict[str, Any], proof: _Proof) -> list[Any] | None:
    """``oneOf`` branches that each only require one key of an object (``{"required": ["a"]}``,
    ``{"required": ["b"]}``: exactly one of a and b) made disjoint, each forbidding the others'
    keys: the same instances, as ``anyOf`` of them. None where the branches are not so."""
    siblings = _siblings(parent)
    keys: list[str] = []
    for branch in branches:
        if not isinstance(branch, dict) or not set(branch) <= _ONE_KEY_BRANCH:
            return None
        required = branch.get("required")
        if not isinstance(required, list) or len(required) != 1 or required[0] in keys:
            return None
        keys.append(required[0])
    objects_only = _types(list(_conjuncts(siblings, proof, 0)))
    if objects_only is None or not objects_only <= {"object"}:
        return None
    return [
        {**branch, "properties": {other: False for other in keys if other != key}}
        for branch, key in zip(branches, keys, strict=True)
    ]


def _conjuncts(schema: object, proof: _Proof, depth: int) -> Iterator[object]:
    """The schemas an instance of ``schema`` also matches: itself, its ``$ref`` target, its
    ``allOf`` members (followed ``_REACH`` deep, so cycles end)."""
    yield schema
    if not isinstance(schema, dict) or depth >= _REACH:
        return
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _resolve(ref, proof.root)
        if target is not None:
            yield from _conjuncts(target, proof, depth + 1)
    members = schema.get("allOf")
    if isinstance(members, list):
        for member in members:
            yield from _conjuncts(member, proof, depth + 1)


def _resolve(ref: str, root: dict[str, Any]) -> object | None:
    """A local ``$ref`` (``#`` or ``#/a/b``) in ``root``; None for any other."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: object = root
    for part in ref[2:].split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _disjoint(left: list[object], right: list[object], proof: _Proof, depth: int) -> bool:
    """True only when no instance matches every schema in ``left`` and every one in ``right``."""
    proof.steps -= 1
    if depth > _REACH or proof.steps < 0:
        return False
    left_types, right_types = _types(left), _types(right)
    if (
        left_types is not None
        and right_types is not None
        and not _intersect(left_types, right_types)
    ):
        return True
    left_values, right_values = _values(left), _values(right)
    if left_values is not None and right_values is not None and not left_values & right_values:
        return True
    return _keys_disjoint(left, left_types, right, proof, depth) or _keys_disjoint(
        right, right_types, left, proof, depth
    )


def _keys_disjoint(
    objects: list[object],
    types: frozenset[str] | None,
    other: list[object],
    proof: _Proof,
    depth: int,
) -> bool:
    """Every instance of ``objects`` is an object with a required key that ``other`` forbids
    (closed, not listed) or holds to a schema disjoint from this one's."""
    if types is None or not types <= {"object"}:
        return False
    for key in _required(objects):
        if any(_forbids(schema, key) for schema in other):
            return True
        mine, theirs = _property(objects, key, proof), _property(other, key, proof)
        if mine and theirs and _disjoint(mine, theirs, proof, depth + 1):
            return True
    return False


def _types(schemas: list[object]) -> frozenset[str] | None:
    """The JSON types an instance may have, as ``type``, ``const`` and ``enum`` say (None: any)."""
    allowed: frozenset[str] | None = None
    for schema in schemas:
        said = _said_types(schema)
        if said is not None:
            allowed = said if allowed is None else _intersect(allowed, said)
    return allowed


def _said_types(schema: object) -> frozenset[str] | None:
    if schema is False:
        return frozenset()
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return frozenset([kind])
    if isinstance(kind, list) and all(isinstance(item, str) for item in kind):
        return frozenset(kind)
    if "const" in schema:
        return frozenset([_type_of(schema["const"])])
    enum = schema.get("enum")
    if isinstance(enum, list):
        return frozenset(_type_of(value) for value in enum)
    return None


def _intersect(left: frozenset[str], right: frozenset[str]) -> frozenset[str]:
    kept = {a for a in left if any(_types_overlap(a, b) for b in right)}
    kept |= {b for b in right if any(_types_overlap(a, b) for a in left)}
    return frozenset(kept)


def _types_overlap(left: str, right: str) -> bool:
    return left == right or {left, right} == {"integer", "number"}


def _type_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"  # overlaps "integer": 1.0 is an integer too
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _values(schemas: list[object]) -> frozenset[str] | None:
    """The instances ``const`` or ``enum`` allow, as comparable keys (None: not listed)."""
    for schema in schemas:
        if isinstance(schema, dict):
            if "const" in schema:
                return frozenset([_value_key(schema["const"])])
            enum = schema.get("enum")
            if isinstance(enum, list):
                return frozenset(_value_key(value) for value in enum)
    return None


def _value_key(value: object) -> str:
    """Equal JSON values, equal keys: 1 and 1.0 alike, true and 1 apart."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"n:{float(value)!r}"
    return json.dumps(value, sort_keys=True)


def _required(schemas: list[object]) -> Iterator[str]:
    for schema in schemas:
        if isinstance(schema, dict) and isinstance(schema.get("required"), list):
            yield from (key for key in schema["required"] if isinstance(key, str))


def _forbids(schema: object, key: str) -> bool:
    """A closed object schema that does not list ``key``."""
    if not isinstance(schema, dict) or schema.get("additionalProperties") is not False:
        return False
    if schema.get("patternProperties"):
        return False
    properties = schema.get("properties")
    return not (isinstance(properties, dict) and key in properties)


def _property(schemas: list[object], key: str, proof: _Proof) -> list[object]:
    """The schemas the value of ``key`` must match, from every schema that lists it."""
    found: list[object] = []
    for schema in schemas:
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(properties, dict) and key in properties:
            found.extend(_conjuncts(properties[key], proof, 0))
    return found
