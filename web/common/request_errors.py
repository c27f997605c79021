"""A pydantic ``ValidationError`` as Trickle's 400: one message that names the field (``param``).

The field path is written the way clients address it (``messages[0].content``,
``stream_options.include_usage``); pydantic's union-branch tags are dropped from it, and its
message follows (``max_tokens: Input should be less than or equal to 1024``).
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from web.common.errors import HttpError, invalid

# Fields accepted only with a no-op value: the message says which value and why.
ONLY_VALUES = {
    "frequency_penalty": "accepts only 0 (use repetition_penalty)",
    "presence_penalty": "accepts only 0 (use repetition_penalty)",
    "logit_bias": "is not supported: only an empty object is accepted",
    "suffix": "is not supported: only an empty string is accepted",
    "reasoning": "is not supported (no reasoning models): only null is accepted",
}
# What a field whose every union branch failed should have been.
SHAPES = {
    "stop": "a string or a list of strings",
    "prompt": "a string or a list of strings (token-id prompts are not supported)",
    "content": "a string or a list of text parts",
    "tool_choice": "'none', 'auto', 'required' or a named function",
}


def request_error(exc: ValidationError, model: type[BaseModel]) -> HttpError:
    """The 400 for the most telling of ``exc``'s errors: a bound or a length before a type."""
    errors = exc.errors(include_url=False, include_input=False)
    error = min(errors, key=lambda e: (e["type"].endswith("_type"), -len(e["loc"])))
    names = _field_names(model)
    if error["type"] == "extra_forbidden":
        names = names | {str(error["loc"][-1])}
    param = field_path(error["loc"], names)
    if not param:
        return invalid("body", "request body must be a JSON object")
    return invalid(param, _message(param, error, errors))


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


def _message(param: str, error: ErrorDetails, errors: list[ErrorDetails]) -> str:
    kind = error["type"]
    leaf = param.rsplit(".", 1)[-1]
    if kind == "extra_forbidden":
        return f"unknown or unsupported field {param!r}"
    if leaf in ONLY_VALUES:
        return f"{param} {ONLY_VALUES[leaf]}"
    if kind == "missing":
        return f"{param} is required"
    if kind == "string_unicode":
        return f"{param} contains an unpaired surrogate (JSON escapes that are not text)"
    failed_branches = sum(1 for e in errors if e["type"].endswith("_type")) > 1
    if leaf in SHAPES and kind.endswith("_type") and (failed_branches or kind == "list_type"):
        return f"{param} must be {SHAPES[leaf]}"
    return f"{param}: {error['msg']}"


@cache
def _field_names(model: type[BaseModel]) -> frozenset[str]:
    """Every field name of ``model`` and of the models nested in it."""
    names: set[str] = set()
    schema = model.model_json_schema()
    for definition in [schema, *schema.get("$defs", {}).values()]:
        names.update(definition.get("properties", {}))
    return frozenset(names)
