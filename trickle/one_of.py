"""``oneOf`` as ``anyOf`` where no instance can match two branches, so llguidance can enforce it.

llguidance refuses ``oneOf`` (an answer must match exactly one branch, which a grammar cannot
check); ``anyOf`` it enforces. The two accept the same instances when the branches are
pairwise disjoint, which most real schemas' ``oneOf`` are by construction: a ``const`` or
``enum`` discriminator property, branches of different types, or a required key that another,
closed branch does not allow. Those are proved here from the schema alone, conservatively.
Where a pair is not proved disjoint, each branch is written together with the complement of
every branch it may overlap (``trickle.negation``): "this one and none of those", which no
two instances share. Where a complement cannot be written the ``oneOf`` stays, and
llguidance's refusal names the keyword.

A branch is read as the conjunction of the schemas an instance must match: the branch itself,
its local ``$ref`` targets, its ``allOf`` members, and the ``oneOf``'s own siblings (the
enclosing schema's ``type``, ``properties`` and ``required`` hold for every branch).
"""

from __future__ import annotations

from typing import Any

from trickle import schema_facts as facts
from trickle.negation import negation
from trickle.schema_facts import Proof

# The most branches that are written each without the others (their number grows as n**2).
MAX_NEGATED = 8
# The most ``oneOf``s of one schema so written: each multiplies the alternatives llguidance's
# check walks through, so nested ones grew its time and memory exponentially (12 levels:
# 10.6 s and 2.25 GB before the 400). The innermost are written; the rest are refused by name.
MAX_NEGATED_ONE_OFS = 3
# What a branch that only requires one key may also say.
_ONE_KEY_BRANCH = frozenset({"required", "title", "description", "$comment"})


def exclusive_one_of(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with each ``oneOf`` whose branches are provably disjoint as ``anyOf`` (or as an
    ``allOf`` member holding the ``anyOf``, beside an ``anyOf`` of its own)."""
    proof, negations_left = Proof(schema), [MAX_NEGATED_ONE_OFS]
    rewritten = facts.rewritten_bottom_up(
        schema, lambda out, node: _rewrite(out, node, proof, negations_left)
    )
    assert isinstance(rewritten, dict)
    return rewritten


def _rewrite(
    out: dict[str, Any], node: dict[str, Any], proof: Proof, negations_left: list[int]
) -> object:
    """One schema (``out``: its subschemas done; ``node``: as sent) with its ``oneOf`` written
    where exact; ``negations_left``: how many more overlapping ``oneOf``s this schema may have
    written each branch without the others."""
    branches = out.get("oneOf")
    if not isinstance(branches, list):
        return out
    apart = _disjoint_pairs(branches, node, proof)
    if not all(apart.values()):
        branches = _one_key_each(branches, node, proof)
        if branches is None and negations_left[0] > 0:
            branches = _each_alone(out["oneOf"], node, apart, proof)
            negations_left[0] -= branches is not None
        if branches is None:
            return out
        out["oneOf"] = branches
    if "anyOf" not in out:
        return {("anyOf" if key == "oneOf" else key): value for key, value in out.items()}
    if not isinstance(out.get("allOf", []), list):
        return out  # an allOf that is no list: left as sent, llguidance's 400 names it
    del out["oneOf"]
    out["allOf"] = [*out.get("allOf", []), {"anyOf": branches}]
    return out


def _disjoint_pairs(
    branches: list[Any], parent: dict[str, Any], proof: Proof
) -> dict[tuple[int, int], bool]:
    """Whether each pair of branches (i < j) is proved disjoint."""
    siblings = _siblings(parent)
    conjunctions = [
        [*facts.conjuncts(branch, proof), *facts.conjuncts(siblings, proof)] for branch in branches
    ]
    return {
        (i, j): _disjoint(conjunctions[i], conjunctions[j], proof, 0)
        for i in range(len(conjunctions))
        for j in range(i + 1, len(conjunctions))
    }


def _each_alone(
    branches: list[Any],
    parent: dict[str, Any],
    apart: dict[tuple[int, int], bool],
    proof: Proof,
) -> list[Any] | None:
    """Branches that may overlap, each as "this branch and none of the others it may overlap"
    (``trickle.negation`` writes the others' complements, within this branch and the schema
    around the ``oneOf``): exactly the instances that match one branch, as ``anyOf`` of them.
    A branch whose overlapping neighbour never fails beside it is left out; None where a
    complement cannot be written, there are more than ``MAX_NEGATED`` branches, or no
    instance is left."""
    if len(branches) > MAX_NEGATED:
        return None
    siblings = _siblings(parent)
    alone: list[Any] = []
    for i, branch in enumerate(branches):
        kinds = facts.types([*facts.conjuncts(branch, proof), *facts.conjuncts(siblings, proof)])
        if kinds is not None and not kinds:
            continue  # no instance of the schema around matches this branch
        members = [branch]
        for j, other in enumerate(branches):
            if j == i or apart[min(i, j), max(i, j)]:
                continue
            complement = negation(other, [siblings, branch], proof)
            if complement is None:
                return None
            complement = [found for found in complement if _may_meet(found, kinds)]
            if not complement:
                break  # the other branch holds wherever this one does
            members.append(complement[0] if len(complement) == 1 else {"anyOf": complement})
        else:
            alone.append(members[0] if len(members) == 1 else {"allOf": members})
    return alone or None


def _may_meet(schema: object, kinds: frozenset[str] | None) -> bool:
    """Whether an instance of one of ``kinds`` (None: any) may match ``schema`` by its type
    (llguidance refuses a schema whose intersection has no type left)."""
    said = facts.types([schema])
    return kinds is None or said is None or bool(facts.intersect(kinds, said))


def _siblings(parent: dict[str, Any]) -> dict[str, Any]:
    """What the schema around a ``oneOf`` says of every branch."""
    return {key: value for key, value in parent.items() if key not in ("oneOf", "anyOf")}


def _one_key_each(branches: list[Any], parent: dict[str, Any], proof: Proof) -> list[Any] | None:
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
    objects_only = facts.types(list(facts.conjuncts(siblings, proof)))
    if objects_only is None or not objects_only <= {"object"}:
        return None
    return [
        {**branch, "properties": {other: False for other in keys if other != key}}
        for branch, key in zip(branches, keys, strict=True)
    ]


def _disjoint(left: list[object], right: list[object], proof: Proof, depth: int) -> bool:
    """True only when no instance matches every schema in ``left`` and every one in ``right``."""
    if not proof.spend() or depth > facts.REACH:
        return False
    left_types, right_types = facts.types(left), facts.types(right)
    if (
        left_types is not None
        and right_types is not None
        and not facts.intersect(left_types, right_types)
    ):
        return True
    left_values, right_values = _value_keys(left), _value_keys(right)
    if left_values is not None and right_values is not None and not left_values & right_values:
        return True
    return _keys_disjoint(left, left_types, right, proof, depth) or _keys_disjoint(
        right, right_types, left, proof, depth
    )


def _keys_disjoint(
    objects: list[object],
    types: frozenset[str] | None,
    other: list[object],
    proof: Proof,
    depth: int,
) -> bool:
    """Every instance of ``objects`` is an object with a required key that ``other`` forbids
    (closed, not listed) or holds to a schema disjoint from this one's."""
    if types is None or not types <= {"object"}:
        return False
    for key in facts.required(objects):
        if any(facts.forbids(schema, key) for schema in other):
            return True
        mine, theirs = (
            facts.property_schemas(objects, key, proof),
            facts.property_schemas(other, key, proof),
        )
        if mine and theirs and _disjoint(mine, theirs, proof, depth + 1):
            return True
    return False


def _value_keys(schemas: list[object]) -> frozenset[str] | None:
    listed = facts.values(schemas)
    return None if listed is None else frozenset(facts.value_key(value) for value in listed)
