"""What a JSON Schema says for sure about its instances, read conservatively from the schema alone.

The exact rewrites that let llguidance enforce more of JSON Schema (``trickle.one_of``,
``trickle.negation``, ``trickle.conditionals``) prove their cases from these facts: the types
an instance may have, the values it may take, the keys an object must or must not hold. Each
answer errs one way only: ``None`` (or an empty answer) where the schema does not say, so a
rewrite that cannot be proved is not made.

A schema is read as the conjunction of the schemas an instance must also match: itself, its
local ``$ref`` target and its ``allOf`` members, followed a few levels deep (so cycles end).
Every proof over one schema shares a budget of steps, so a hostile schema's stay bounded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from trickle.patterns import DATA_KEYWORDS as DATA_KEYWORDS
from trickle.patterns import SCHEMA_MAPS as SCHEMA_MAPS

# How far $ref, allOf and nested properties are followed, and how many steps one schema's
# proofs may take (past it, nothing more is proved and the keyword stays, refused).
REACH = 6
STEPS = 20_000
# Keywords that say nothing of an instance.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "$comment",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$id",
        "$schema",
    }
)
# Keywords whose values are data (never rewritten), and those whose values map names to
# schemas (a property may be called "enum"): as the pattern anchoring reads them.
DATA = DATA_KEYWORDS


class Proof:
    """The schema that ``$ref``s are read in, and the steps left to one schema's proofs."""

    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.steps = STEPS

    def spend(self) -> bool:
        """One step; False once the budget is spent."""
        self.steps -= 1
        return self.steps >= 0


def conjuncts(schema: object, proof: Proof, depth: int = 0) -> Iterator[object]:
    """The schemas an instance of ``schema`` also matches: itself, its ``$ref`` target, its
    ``allOf`` members (followed ``REACH`` deep, so cycles end)."""
    yield schema
    if not isinstance(schema, dict) or depth >= REACH or not proof.spend():
        return  # a step a schema followed: repeated $refs cannot multiply the work unbounded
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = resolve(ref, proof.root)
        if target is not None:
            yield from conjuncts(target, proof, depth + 1)
    members = schema.get("allOf")
    if isinstance(members, list):
        for member in members:
            yield from conjuncts(member, proof, depth + 1)


def named_draft(root: dict[str, Any], drafts: Iterable[str]) -> str | None:
    """The first of ``drafts`` (``$schema`` fragments such as ``draft-04``) that the root's
    ``$schema`` names, None where it names none of them (or no ``$schema`` is given)."""
    said = root.get("$schema")
    return next((draft for draft in drafts if isinstance(said, str) and draft in said), None)


def without(node: dict[str, Any], key: str) -> dict[str, Any]:
    """A copy of ``node`` less ``key`` (the rewrites' way to drop a keyword they served)."""
    return {name: value for name, value in node.items() if name != key}


def resolve(ref: str, root: dict[str, Any]) -> object | None:
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


def types(schemas: list[object]) -> frozenset[str] | None:
    """The JSON types an instance may have, as ``type``, ``const`` and ``enum`` say (None: any)."""
    allowed: frozenset[str] | None = None
    for schema in schemas:
        said = _said_types(schema)
        if said is not None:
            allowed = said if allowed is None else intersect(allowed, said)
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
        return frozenset([type_of(schema["const"])])
    enum = schema.get("enum")
    if isinstance(enum, list):
        return frozenset(type_of(value) for value in enum)
    return None


def intersect(left: frozenset[str], right: frozenset[str]) -> frozenset[str]:
    """Types both allow (``integer`` and ``number`` overlap: an integer is a number)."""
    kept = {a for a in left if any(_types_overlap(a, b) for b in right)}
    kept |= {b for b in right if any(_types_overlap(a, b) for a in left)}
    return frozenset(kept)


def _types_overlap(left: str, right: str) -> bool:
    return left == right or {left, right} == {"integer", "number"}


def type_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"  # overlaps "integer": 1.0 is an integer too
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def values(schemas: list[object]) -> list[Any] | None:
    """The instances ``const`` or ``enum`` allow (None: not listed)."""
    for schema in schemas:
        if isinstance(schema, dict):
            if "const" in schema:
                return [schema["const"]]
            enum = schema.get("enum")
            if isinstance(enum, list):
                return list(enum)
    return None


def rewritten_bottom_up(
    node: object, rewrite: Callable[[dict[str, Any], dict[str, Any]], object]
) -> object:
    """``node`` with each schema in it replaced by ``rewrite(children_done, as_sent)``, its
    subschemas first; data keywords (``const``, ``enum``, ``default`` ...) are not entered. The
    one walk of the rewrites (formats, ``uniqueItems``, ``oneOf``)."""
    if isinstance(node, list):
        return [rewritten_bottom_up(item, rewrite) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in DATA:
            out[key] = value
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: rewritten_bottom_up(item, rewrite) for name, item in value.items()}
        else:
            out[key] = rewritten_bottom_up(value, rewrite)
    return rewrite(out, node)


def value_key(value: object) -> str:
    """Equal JSON values, equal keys: 1 and 1.0 alike (nested too), true and 1 apart, and
    integers past 2**53 apart (a float would merge them; JSON Schema compares them exactly)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"n:{_number(value)!r}"
    return json.dumps(_numbers_normalized(value), sort_keys=True)


def _number(value: int | float) -> int | float:
    """An integral number as its exact integer (1.0 as 1), any other as the float it is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _numbers_normalized(value: object) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number(value)
    if isinstance(value, list):
        return [_numbers_normalized(item) for item in value]
    if isinstance(value, dict):
        return {key: _numbers_normalized(item) for key, item in value.items()}
    return value


def required(schemas: list[object]) -> Iterator[str]:
    """The keys an object instance must hold."""
    for schema in schemas:
        if isinstance(schema, dict) and isinstance(schema.get("required"), list):
            yield from (key for key in schema["required"] if isinstance(key, str))


def forbids(schema: object, key: str) -> bool:
    """A closed object schema that does not list ``key``."""
    if not isinstance(schema, dict) or schema.get("additionalProperties") is not False:
        return False
    if schema.get("patternProperties"):
        return False
    properties = schema.get("properties")
    return not (isinstance(properties, dict) and key in properties)


def property_schemas(schemas: list[object], key: str, proof: Proof) -> list[object]:
    """The schemas the value of ``key`` must match, from every schema that lists it."""
    found: list[object] = []
    for schema in schemas:
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(properties, dict) and key in properties:
            found.extend(conjuncts(properties[key], proof))
    return found
