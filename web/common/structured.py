"""Structured output on the OpenAI routes: ``response_format`` (chat, legacy completions) and
``text.format`` (Responses) as the grammar a job carries, refused with a 400 naming the field
(and the JSON Schema keyword) when it cannot be enforced. Forced tool calls get theirs in
``web.common.tools.definitions``."""

from __future__ import annotations

import dataclasses
from typing import Any

from trickle.grammar import GrammarError, json_object_grammar, json_schema_grammar
from trickle.params import GenerationParams
from web.common.errors import HttpError, invalid
from web.common.format_models import (
    JsonObjectFormat,
    JsonSchemaFormat,
    TextJsonSchemaFormat,
    TextResponseFormat,
)
from web.common.unchecked_formats import note_unchecked_formats

AnyFormat = TextResponseFormat | JsonObjectFormat | JsonSchemaFormat | TextJsonSchemaFormat


def format_grammar(fmt: AnyFormat | None, field: str) -> str | None:
    """The grammar of ``response_format`` (or ``text.format``: ``field`` says which); None for
    plain text."""
    try:
        if isinstance(fmt, JsonObjectFormat):
            return json_object_grammar()
        if isinstance(fmt, JsonSchemaFormat):
            grammar = json_schema_grammar(fmt.json_schema.schema_, f"{field}.json_schema.schema")
            note_unchecked_formats(fmt.json_schema.schema_)
            return grammar
        if isinstance(fmt, TextJsonSchemaFormat):
            grammar = json_schema_grammar(fmt.schema_, f"{field}.schema")
            note_unchecked_formats(fmt.schema_)
            return grammar
    except GrammarError as exc:
        raise grammar_refused(exc) from None
    return None


def grammar_refused(exc: GrammarError) -> HttpError:
    """A ``GrammarError`` as the 400 every route gives: ``param`` the field, the message names
    the JSON Schema keyword at fault."""
    return invalid(exc.field, exc.message)


def constrained(params: GenerationParams, grammar: str | None) -> GenerationParams:
    """``params`` with the answer's grammar. ``ignore_eos`` contradicts one: the answer ends
    when the grammar is complete, and nothing may follow it."""
    if grammar is None:
        return params
    if params.ignore_eos:
        raise invalid(
            "ignore_eos",
            "ignore_eos cannot be combined with structured output or a forced tool call: "
            "the answer ends where its grammar is complete",
        )
    return dataclasses.replace(params, grammar=grammar)


def format_echo(fmt: AnyFormat | None) -> dict[str, Any]:
    """``text.format`` as a response object echoes it."""
    if fmt is None:
        return {"type": "text"}
    return fmt.model_dump(by_alias=True, exclude_none=True)
