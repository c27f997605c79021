"""Formats llguidance does not know, rewritten into keywords it enforces, where their meaning is
exact, so a schema that uses them is served instead of refused (and bounds are kept, not
ignored).

llguidance 1.9 knows ten string formats (``date-time``, ``email``, ``uri``...) and refuses any
other on a schema that may be a string; on a schema that cannot be one it ignores every
``format``. JSON Schema defines a format for one type: other instances pass it. So:

- OpenAPI's fixed-width integers (``int8``-``int32``, ``uint8``-``uint32``) hold numbers to an
  integer in their range: ``minimum``/``maximum`` intersected with the schema's own, and
  ``multipleOf: 1`` where the schema allows numbers that are not integers; all three pass
  other types, as the format does. ``int64``/``uint64`` are not rewritten: llguidance reads a
  bound through a double, and fails on -2**63 and cuts 2**64 - 1, so neither range is exact;
  nor ``float``/``double``, whose IEEE range llguidance cannot write as a number range.
- ``byte`` (RFC 4648 base64, padded), ``uri-reference`` (RFC 3986), ``iri`` and
  ``iri-reference`` (RFC 3987) are regular languages: a ``pattern`` (strings only, as the
  format), anchored at both ends, beside any ``pattern`` the schema has.
- Any of these formats, and every other one whose type is known (the numeric ones above, and
  ``int64``, ``uint64``, ``float``, ``double``), on a schema that allows no instance of that
  type constrains nothing and is dropped.

- ``json-pointer`` and ``relative-json-pointer`` (RFC 6901 and its draft) are regular too:
  patterns. ``idn-email`` is served as ``email``: every address llguidance's ``email`` writes
  is an internationalized one too (the answer is valid; not every valid one can be written).
- A format no specification defines (``UNCHECKED``: ``topic``, ``non-blank``, ``url``,
  ``DATE``; names are case-sensitive) is an annotation: JSON Schema says a validator that
  does not know a format passes every instance (2020-12, validation section 7.2; OpenAPI:
  "MAY default back to the type alone"), and so do ``jsonschema`` and every validator
  Trickle's tests use, so the answer is valid whatever the string holds. It is dropped, and
  ``unchecked_formats`` names it so the web tier tells the client (never silently).
  OpenAPI's ``password`` and ``binary`` (any string) are dropped as constraining nothing.

``regex`` (not a regular language), ``uri-template`` and ``idn-hostname`` (IDNA's rules are no
pattern llguidance takes) have a defined meaning that is not enforced: refused, naming them.
"""

from __future__ import annotations

from typing import Any

from trickle import schema_facts as facts
from trickle.schema_facts import Proof

INTEGER_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}
# Formats of numbers that are not rewritten, but constrain no other instance.
_OTHER_NUMERIC = frozenset({"int64", "uint64", "float", "double"})
_NUMBERS = frozenset({"integer", "number"})


def _ipv6(h16: str, ls32: str) -> str:
    """RFC 3986's IPv6address, its nine forms as one alternation."""
    forms = [f"(?:{h16}:){{6}}{ls32}", f"::(?:{h16}:){{5}}{ls32}"]
    for before, after in ((0, 4), (1, 3), (2, 2), (3, 1), (4, 0)):
        tail = f"(?:{h16}:){{{after}}}{ls32}" if after != 1 else f"{h16}:{ls32}"
        forms.append(f"(?:{_h16_run(h16, before)})?::{tail}")
    forms.append(f"(?:{_h16_run(h16, 5)})?::{h16}")
    forms.append(f"(?:{_h16_run(h16, 6)})?::")
    return "|".join(f"(?:{form})" for form in forms)


def _h16_run(h16: str, more: int) -> str:
    """``[ *more( h16 ":" ) h16 ]``'s inside."""
    return f"(?:{h16}:){{0,{more}}}{h16}" if more else h16


_HEX = "[0-9A-Fa-f]"
_PCT = f"%{_HEX}{{2}}"
_SUB_DELIMS = "!$&'()*+,;="
_DEC_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9][0-9]|[0-9])"
_IPV4 = rf"{_DEC_OCTET}(?:\.{_DEC_OCTET}){{3}}"
_H16 = f"{_HEX}{{1,4}}"
_IP_LITERAL = (
    rf"\[(?:{_ipv6(_H16, f'(?:{_H16}:{_H16}|{_IPV4})')}"
    rf"|v{_HEX}+\.[A-Za-z0-9\-._~{_SUB_DELIMS}:]+)\]"
)
# RFC 3987's ucschar and iprivate, as character-class ranges.
_UCSCHAR = "".join(
    f"{chr(low)}-{chr(high)}"
    for low, high in (
        (0xA0, 0xD7FF),
        (0xF900, 0xFDCF),
        (0xFDF0, 0xFFEF),
        *((plane << 16, (plane << 16) + 0xFFFD) for plane in range(1, 14)),
        (0xE1000, 0xEFFFD),
    )
)
_IPRIVATE = "".join(
    f"{chr(low)}-{chr(high)}"
    for low, high in ((0xE000, 0xF8FF), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD))
)


def _reference(unreserved: str, private: str, absolute_only: bool) -> str:
    """RFC 3986's URI-reference (RFC 3987's IRI-reference with the IRI character sets), or its
    URI (IRI) alone, as a regex of the whole string."""
    plain = f"[{unreserved}{_SUB_DELIMS}]"
    pchar = f"(?:[{unreserved}{_SUB_DELIMS}:@]|{_PCT})"
    segment = f"{pchar}*"
    nz_nc = f"(?:[{unreserved}{_SUB_DELIMS}@]|{_PCT})+"
    host = f"(?:{_IP_LITERAL}|(?:{plain}|{_PCT})*)"
    authority = f"(?:(?:[{unreserved}{_SUB_DELIMS}:]|{_PCT})*@)?{host}(?::[0-9]*)?"
    abempty = f"(?:/{segment})*"
    absolute = f"/(?:{pchar}+{abempty})?"
    query = rf"(?:\?(?:[{unreserved}{_SUB_DELIMS}:@/?{private}]|{_PCT})*)?"
    fragment = f"(?:#(?:{pchar}|[/?])*)?"
    scheme = r"[A-Za-z][A-Za-z0-9+\-.]*"
    hier = f"(?://{authority}{abempty}|{absolute}|{pchar}+{abempty}|)"
    uri = f"{scheme}:{hier}{query}{fragment}"
    if absolute_only:
        return f"^{uri}$"
    relative = f"(?://{authority}{abempty}|{absolute}|{nz_nc}{abempty}|){query}{fragment}"
    return f"^(?:{uri}|{relative})$"


_UNRESERVED = r"A-Za-z0-9\-._~"
STRING_PATTERNS = {
    "byte": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
    "uri-reference": _reference(_UNRESERVED, "", absolute_only=False),
    "iri": _reference(_UNRESERVED + _UCSCHAR, _IPRIVATE, absolute_only=True),
    "iri-reference": _reference(_UNRESERVED + _UCSCHAR, _IPRIVATE, absolute_only=False),
}
_JSON_POINTER = "(?:/(?:[^~/]|~[01])*)*"
STRING_PATTERNS["json-pointer"] = f"^{_JSON_POINTER}$"
STRING_PATTERNS["relative-json-pointer"] = f"^(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})$"
# Formats served as another whose every instance is one of theirs.
_SERVED_AS = {"idn-email": "email"}
# What llguidance enforces itself, and every format a specification defines: JSON Schema's
# (2020-12), OpenAPI's and the ones above. Any other name is a custom annotation.
_LLGUIDANCE = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"}
)
_DEFINED = frozenset(
    {"regex", "uri-template", "idn-hostname", *_LLGUIDANCE, *STRING_PATTERNS, *_SERVED_AS}
    | {*INTEGER_RANGES, *_OTHER_NUMERIC}
)
# OpenAPI's formats that hold any string: nothing to enforce.
_ANY_STRING = frozenset({"password", "binary"})
FORMAT_MARKER = '"format"'


def unchecked(name: str) -> bool:
    """Whether ``name`` is a format no specification defines (an annotation, not enforced)."""
    return name not in _DEFINED and name not in _ANY_STRING


def unchecked_formats(schema: object) -> list[str]:
    """The custom formats ``schema`` names (sorted; the walk ``exact_formats`` drops them by):
    served as annotations, so the web tier tells the client they were not enforced."""
    found: set[str] = set()

    def note(out: dict[str, Any], _: dict[str, Any]) -> object:
        name = out.get("format")
        if isinstance(name, str) and unchecked(name):
            found.add(name)
        return out

    facts.rewritten_bottom_up(schema, note)
    return sorted(found)


def exact_formats(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every format of ``INTEGER_RANGES`` and ``STRING_PATTERNS`` written as the
    keywords that mean it, and every format dropped where no instance is of its type."""
    proof = Proof(schema)
    rewritten = facts.rewritten_bottom_up(schema, lambda out, node: _rewrite(out, node, proof))
    assert isinstance(rewritten, dict)
    return rewritten


def _rewrite(out: dict[str, Any], node: dict[str, Any], proof: Proof) -> object:
    """One schema (``out``: its subschemas done; ``node``: as sent) with its format written."""
    name = out.get("format")
    if not isinstance(name, str):
        return out
    if unchecked(name) or name in _ANY_STRING:
        return facts.without(out, "format")  # an annotation (see the module's docstring)
    if name in _SERVED_AS:
        return {**out, "format": _SERVED_AS[name]}
    kinds = facts.types(list(facts.conjuncts(node, proof)))
    if name in STRING_PATTERNS:
        return _string_format(out, STRING_PATTERNS[name], kinds)
    if name in INTEGER_RANGES or name in _OTHER_NUMERIC:
        if kinds is not None and not kinds & _NUMBERS:
            return facts.without(out, "format")
        if name in INTEGER_RANGES:
            return _integer_format(out, *INTEGER_RANGES[name], kinds)
    return out


def _string_format(node: dict[str, Any], pattern: str, kinds: frozenset[str] | None) -> Any:
    """The format as a ``pattern`` (a second one as an ``allOf`` member)."""
    out = facts.without(node, "format")
    if kinds is not None and "string" not in kinds:
        return out
    if "pattern" not in out:
        return {**out, "pattern": pattern}
    members = out.get("allOf", [])
    if not isinstance(members, list):
        return node
    return {**out, "allOf": [*members, {"pattern": pattern}]}


def _integer_format(
    node: dict[str, Any], low: int, high: int, kinds: frozenset[str] | None
) -> dict[str, Any]:
    """Numbers held to the integers of [low, high]; the node as it was where its own bounds
    are not plain numbers (llguidance judges them)."""
    out = facts.without(node, "format")
    for key, bound, tighter in (("minimum", low, max), ("maximum", high, min)):
        own = out.get(key)
        exclusive = "exclusiveMinimum" if key == "minimum" else "exclusiveMaximum"
        if own is None or (_is_number(own) and tighter(own, bound) != own):
            # draft 4's boolean exclusive flag qualifies the looser bound (or none): it goes
            if isinstance(out.get(exclusive), bool):
                del out[exclusive]
            out[key] = bound
        elif not _is_number(own):
            return node
    if kinds is None or "number" in kinds:
        step = out.get("multipleOf", 1)
        if not _is_number(step) or step != int(step):
            return node  # a fractional step intersected with 1 is no single multipleOf
        out["multipleOf"] = step
    return out


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
