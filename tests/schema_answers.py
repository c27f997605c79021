"""Schemas whose answers a greedy closing walk could not end (formats, patterns, nested
minimum lengths), and the check that an answer to one parses and validates, formats included
(jsonschema checks email, date, ipv4, ipv6 and uuid here; date-time, time and uri without its
optional packages only by the patterns below)."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema

# RFC 3339 as llguidance writes it (``T``/``Z`` in either case).
_TIME = r"\d{2}:\d{2}:\d{2}(\.\d+)?([zZ]|[+-]\d{2}:\d{2})"
_FORMATS = {
    "date-time": re.compile(rf"\d{{4}}-\d{{2}}-\d{{2}}[tT]{_TIME}"),
    "time": re.compile(_TIME),
    "uri": re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S*"),
}
SHAPES: dict[str, dict[str, Any]] = {
    "email": {"type": "string", "format": "email"},
    "date-time": {"type": "string", "format": "date-time"},
    "time": {"type": "string", "format": "time"},
    "uri": {"type": "string", "format": "uri"},
    "pattern": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3,5}(x|yz)$"},
    "nested minLength": {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"type": "string", "minLength": 12}}},
        "required": ["a"],
    },
    # A discriminated union, served as anyOf (trickle/one_of.py), a format and a pattern inside.
    "oneOf": {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "mail"},
                    "to": {"type": "string", "format": "email"},
                },
                "required": ["kind", "to"],
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "code"}, "id": {"pattern": "^[A-Z]{3}[0-9]{2}$"}},
                "required": ["kind", "id"],
            },
        ]
    },
}


def field_schema(value: dict[str, Any]) -> dict[str, Any]:
    """An object whose one required field ``d`` is ``value``."""
    return {"type": "object", "properties": {"d": value}, "required": ["d"]}


def assert_valid(schema: dict[str, Any], text: str) -> Any:
    """``text`` parses and validates against ``schema``, formats included; its value."""
    value = json.loads(text)
    validator = jsonschema.Draft202012Validator
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(value)
    for found, fmt in _formats(schema, value):
        assert _FORMATS[fmt].fullmatch(found), (fmt, found)
    return value


def _formats(schema: Any, value: Any) -> list[tuple[str, str]]:
    """(value, format) for the formats jsonschema cannot check here."""
    found: list[tuple[str, str]] = []
    if isinstance(schema, dict):
        if schema.get("format") in _FORMATS and isinstance(value, str):
            found.append((value, schema["format"]))
        for key, sub in schema.get("properties", {}).items():
            if isinstance(value, dict) and key in value:
                found += _formats(sub, value[key])
        for branch in schema.get("oneOf", []):
            found += _formats(branch, value)
        if isinstance(schema.get("items"), dict) and isinstance(value, list):
            for item in value:
                found += _formats(schema["items"], item)
    return found
