"""The complement of a schema, written without ``not``, where one can be: what ``not`` and the
``else`` of an ``if`` are rewritten with (``trickle.conditionals``), so llguidance can enforce them.

llguidance has no ``not``: a grammar cannot refuse what an arbitrary schema accepts. But the
schemas real ``if``s and ``not``s test are mostly discriminators, and their complements are
plain schemas: "lacks the key k" is ``properties: {k: false}`` on an object; "k is present and
not "cat"" is ``required: [k]`` with ``k`` held to the other values its own schema lists; "not a
string" is the other types. A schema is negated keyword by keyword (an instance fails a
schema where it fails one of its keywords), through ``anyOf`` (fails every branch), ``allOf``
(fails one member), ``not`` (matches it) and local ``$ref``s.

Complements are taken within a context: the schemas the instance is known to match besides
(the enclosing schema's ``type``, ``enum``, ``properties``), which is where a finite set of
values to take the others from comes from. Where a keyword's complement cannot be written
(``pattern``, ``minimum``, a value whose alternatives are not listed), there is no negation,
and the keyword that asked for one stays, for llguidance to refuse by name.
"""

from __future__ import annotations

import re
from typing import Any

from trickle import schema_facts as facts
from trickle.schema_facts import Proof

ALL_TYPES = ("null", "boolean", "object", "array", "string", "number")
# Keywords that are independent conjuncts (unlike additionalProperties, which reads properties).
_NEGATED = frozenset(
    {"type", "const", "enum", "required", "properties", "anyOf", "allOf", "not", "pattern"}
)
_TYPE_NAMES = frozenset({*ALL_TYPES, "integer"})
# A pattern that strings of one character class match whole: ^[...]+$ or ^[...]*$ (a class
# without nested classes or set operations, which regex dialects read differently).
_WHOLE_CLASS = re.compile(r"\^\[(?!\^)((?:\\.|[^\]\\\[&~-]|(?<!-)-(?!-))+)\]([*+])\$")
_FINITE_TYPES: dict[str, list[Any]] = {"null": [None], "boolean": [True, False]}

# A complement: schemas an instance in the context matches exactly where it fails the negated
# schema, as a disjunction ([] where it never fails; None where no complement can be written).
Complement = list[object]


def negation(schema: object, context: list[object], proof: Proof) -> Complement | None:
    """Schemas whose union accepts exactly those instances of every ``context`` schema that
    ``schema`` refuses (they may accept others, outside the context); None where none can be
    written without ``not``."""
    known = [found for given in context for found in facts.conjuncts(given, proof)]
    return _negated(schema, known, proof, 0)


def _negated(schema: object, context: list[object], proof: Proof, depth: int) -> Complement | None:
    """``negation`` within a context already read through its ``$ref``s and ``allOf``s."""
    if not proof.spend() or depth > facts.REACH:
        return None
    if schema is True:
        return []
    if schema is False:
        return [{}]
    if not isinstance(schema, dict):
        return None
    keys = set(schema) - facts.ANNOTATIONS
    if "$ref" in keys:
        return _negated_reference(schema, keys, context, proof, depth)
    if not keys <= _NEGATED:
        return None
    alternatives: Complement = []
    for key in sorted(keys, key=list(schema).index):
        found = _negated_keyword(key, schema[key], context, proof, depth)
        if found is None:
            return None
        alternatives.extend(found)
    return alternatives


def _negated_reference(
    schema: dict[str, Any], keys: set[str], context: list[object], proof: Proof, depth: int
) -> Complement | None:
    """A local ``$ref``'s target and its siblings, each negated (the instance must match both)."""
    ref = schema["$ref"]
    target = facts.resolve(ref, proof.root) if isinstance(ref, str) else None
    if target is None:
        return None
    around = _negated({key: schema[key] for key in keys - {"$ref"}}, context, proof, depth + 1)
    inside = _negated(target, context, proof, depth + 1)
    if around is None or inside is None:
        return None
    return [*around, *inside]


def _negated_keyword(
    key: str, value: Any, context: list[object], proof: Proof, depth: int
) -> Complement | None:
    if key == "type":
        return _other_types(value, context)
    if key in ("const", "enum"):
        listed = [value] if key == "const" else value
        return _other_values(listed, context) if isinstance(listed, list) else None
    if key == "required":
        return _missing_keys(value, context)
    if key == "pattern":
        return _unmatched_strings(value)
    if key == "properties":
        return (
            _other_property_values(value, context, proof, depth)
            if isinstance(value, dict)
            else None
        )
    if key == "not":
        return [value]
    if not isinstance(value, list) or not value:
        return None
    members = [_negated(member, context, proof, depth + 1) for member in value]
    if any(member is None for member in members):
        return None
    if key == "allOf":  # fails one member
        return [alternative for member in members for alternative in member or []]
    # anyOf: fails every branch (where one branch never fails, neither does the anyOf)
    if any(not member for member in members):
        return []
    return [{"allOf": [_either(member or []) for member in members]}]


def _either(alternatives: Complement) -> object:
    """One schema for a disjunction."""
    return alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}


def _other_types(value: object, context: list[object]) -> Complement | None:
    """Every type ``value`` (a ``type``) does not name. An integer's complement holds the
    numbers that are not integers, which no ``type`` says: only where the context allows no
    number at all."""
    named = [value] if isinstance(value, str) else value
    if not isinstance(named, list) or not all(kind in _TYPE_NAMES for kind in named):
        return None
    known = facts.types(context)
    others = [kind for kind in ALL_TYPES if kind not in named]
    if "integer" in named and "number" not in named:
        if known is None or "number" in known:
            return None
        others.remove("number")  # the context's numbers are integers
    if known is not None:
        others = [kind for kind in others if facts.intersect(frozenset([kind]), known)]
    return [{"type": others[0] if len(others) == 1 else others}] if others else []


def _other_values(listed: list[Any], context: list[object]) -> Complement | None:
    """The values the context allows that ``listed`` (a ``const`` or ``enum``) does not."""
    domain = facts.values(context)
    if domain is None:
        domain = _branch_values(context)
    if domain is None:
        known = facts.types(context)
        if known is None or not known <= set(_FINITE_TYPES):
            return None
        domain = [value for kind in sorted(known) for value in _FINITE_TYPES[kind]]
    taken = {facts.value_key(value) for value in listed}
    others = [value for value in domain if facts.value_key(value) not in taken]
    return [{"enum": others}] if others else []


def _unmatched_strings(pattern: object) -> Complement | None:
    """The strings a whole-string character-class pattern (``^[a-z]+$``) does not match: those
    holding a character outside the class, and the empty one where the class must repeat at
    least once. Other values are not strings, which every pattern lets through. Any other
    pattern's complement would need a look-ahead."""
    found = _WHOLE_CLASS.fullmatch(pattern) if isinstance(pattern, str) else None
    if found is None:
        return None
    body, repeat = found.groups()
    outside: Complement = [{"type": "string", "pattern": f"[^{body}]"}]
    return [*outside, {"const": ""}] if repeat == "+" else outside


def _branch_values(context: list[object]) -> list[Any] | None:
    """The values of a context schema whose ``anyOf`` / ``oneOf`` branches each list theirs."""
    for schema in context:
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key) if isinstance(schema, dict) else None
            if isinstance(branches, list) and branches:
                listed = [facts.values([branch]) for branch in branches]
                if all(values is not None for values in listed):
                    return [value for values in listed for value in values or []]
    return None


def _missing_keys(value: object, context: list[object]) -> Complement | None:
    """Objects that lack one of the ``required`` keys (keys the context requires are never
    missing)."""
    if not isinstance(value, list) or not all(isinstance(key, str) for key in value):
        return None
    held = set(facts.required(context))
    return [{"type": "object", "properties": {key: False}} for key in value if key not in held]


def _other_property_values(
    properties: dict[str, Any], context: list[object], proof: Proof, depth: int
) -> Complement | None:
    """Objects that hold one of ``properties`` with a value its schema refuses (the value is
    known to match what the context says of that key)."""
    alternatives: Complement = []
    for key, schema in properties.items():
        inside = facts.property_schemas(context, key, proof)
        found = _negated(schema, inside, proof, depth + 1)
        if found is None:
            return None
        alternatives.extend(
            {"type": "object", "required": [key], "properties": {key: alternative}}
            for alternative in found
        )
    return alternatives
