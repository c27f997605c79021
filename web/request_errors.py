"""A pydantic ``ValidationError`` as Trickle's 400: one message that names the field (``param``).

The field path is written the way clients address it (``messages[0].content``,
``stream_options.include_usage``); pydantic's union-branch tags are dropped from it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from web.errors import ApiError, invalid

# Fields accepted only with a no-op value: the message says which value and why.
ONLY_VALUES = {
    "frequency_penalty": "accepts only 0 (use repetition_penalty)",
    "presence_penalty": "accepts only 0 (use repetition_penalty)",
    "logit_bias": "is not supported: only an empty object is accepted",
    "tools": "(function calling) is not supported: only an empty list is accepted",
    "tool_choice": "(function calling) is not supported: only 'none' is accepted",
    "suffix": "is not supported: only an empty string is accepted",
    "response_format": "accepts only {'type': 'text'}",
}
# What a field whose every union branch failed should have been.
SHAPES = {
    "stop": "a string or a list of strings",
    "prompt": "a string or a list of strings (token-id prompts are not supported)",
    "content": "a string or a list of text parts",
}
TYPE_NAMES = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "finite_number": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def request_error(exc: ValidationError, model: type[BaseModel]) -> ApiError:
    """The 400 for the most telling of ``exc``'s errors."""
    errors = exc.errors(include_url=False)
    error = min(errors, key=lambda e: (e["type"] in TYPE_NAMES, -len(e["loc"])))
    names = _field_names(model)
    if error["type"] == "extra_forbidden":
        names = names | {str(error["loc"][-1])}
    param = field_path(error["loc"], names)
    if not param:
        return invalid("body", "request body must be a JSON object")
    return invalid(param, _message(param, error, errors, model))


def field_path(loc: tuple[int | str, ...], names: frozenset[str]) -> str:
    """``('messages', 0, 'str', 'content')`` -> ``messages[0].content``; a trailing index is
    dropped (``stop[1]`` is reported as ``stop``)."""
    parts: list[str] = []
    pending_index = ""
    for item in loc:
        if isinstance(item, int):
            pending_index += f"[{item}]"
        elif item in names:
            if parts:
                parts[-1] += pending_index
            pending_index = ""
            parts.append(item)
    return ".".join(parts)


def _message(
    param: str, error: ErrorDetails, errors: list[ErrorDetails], model: type[BaseModel]
) -> str:
    kind, ctx = error["type"], error.get("ctx", {})
    leaf = param.rsplit(".", 1)[-1]
    if leaf in ONLY_VALUES and kind != "extra_forbidden":
        return f"{param} {ONLY_VALUES[leaf]}"
    if kind == "missing":
        return f"{param} is required"
    if kind == "extra_forbidden":
        return f"unknown or unsupported field {param!r}"
    if kind == "string_unicode":
        return f"{param} contains an unpaired surrogate at position {_surrogate_at(error)}"
    if kind in TYPE_NAMES:
        failed_branches = sum(1 for e in errors if e["type"] in TYPE_NAMES) > 1
        if leaf in SHAPES and (failed_branches or kind == "list_type"):
            return f"{param} must be {SHAPES[leaf]}"
        return f"{param} must be {TYPE_NAMES[kind]}"
    if kind in ("greater_than_equal", "less_than_equal"):
        low, high = _bounds(model, param)
        if low is not None and high is not None:
            return f"{param} must be between {low} and {high}"
        bound = ctx.get("ge", ctx.get("le"))
        return f"{param} must be {'>=' if kind == 'greater_than_equal' else '<='} {bound}"
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        unit = "characters" if kind.startswith("string") else "items"
        if kind.endswith("too_short"):
            if ctx.get("min_length") == 1:
                return f"{param} must not be empty"
            return f"{param} must have at least {ctx.get('min_length')} {unit}"
        return f"{param} must have at most {ctx.get('max_length')} {unit}"
    if kind == "literal_error":
        return f"{param} must be {ctx.get('expected')}"
    return f"{param}: {error['msg']}"


def _surrogate_at(error: ErrorDetails) -> int:
    text = error.get("input")
    try:
        str(text).encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return 0


def _bounds(model: type[BaseModel], param: str) -> tuple[Any, Any]:
    """The inclusive range of a top-level numeric field, read from the model's own schema."""
    prop = _schema(model)["properties"].get(param, {})
    for branch in [prop, *prop.get("anyOf", [])]:
        if "minimum" in branch and "maximum" in branch:
            return branch["minimum"], branch["maximum"]
    return None, None


@cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


@cache
def _field_names(model: type[BaseModel]) -> frozenset[str]:
    """Every field name of ``model`` and of the models nested in it."""
    names: set[str] = set()
    schema = _schema(model)
    for definition in [schema, *schema.get("$defs", {}).values()]:
        names.update(definition.get("properties", {}))
    return frozenset(names)
