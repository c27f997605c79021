"""The wire shapes of structured output: chat's and legacy completions' ``response_format`` and
the Responses API's ``text.format``. Turning them into a grammar is ``web.common.structured``'s
job."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

FORMAT_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, populate_by_name=True)
# OpenAI's rule for a schema's name.
SchemaName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
SCHEMA_DESCRIPTION = "a JSON Schema the answer must match (docs/structured-output.md)"
STRICT_DESCRIPTION = "accepted either way: the schema is always enforced"


class TextResponseFormat(BaseModel):
    model_config = FORMAT_STRICT

    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    """Any JSON object."""

    model_config = FORMAT_STRICT

    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    model_config = FORMAT_STRICT

    name: SchemaName
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description=SCHEMA_DESCRIPTION)
    strict: bool | None = Field(None, description=STRICT_DESCRIPTION)


class JsonSchemaFormat(BaseModel):
    """Chat's ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``."""

    model_config = FORMAT_STRICT

    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


def _format_type(value: Any) -> str | None:
    """The branch a format's ``type`` picks, tagged so that the tag, which pydantic puts in an
    error's location, is never taken for a field (``json_schema`` is both)."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"type={kind}" if isinstance(kind, str) else None


def _discriminator() -> Discriminator:
    return Discriminator(
        _format_type,
        custom_error_type="format_type",
        custom_error_message="type must be 'text', 'json_object' or 'json_schema'",
    )


ResponseFormat = Annotated[
    Annotated[TextResponseFormat, Tag("type=text")]
    | Annotated[JsonObjectFormat, Tag("type=json_object")]
    | Annotated[JsonSchemaFormat, Tag("type=json_schema")],
    _discriminator(),
]


class TextJsonSchemaFormat(BaseModel):
    """The Responses API's flat form: ``{"type": "json_schema", "name", "schema", "strict"}``."""

    model_config = FORMAT_STRICT

    type: Literal["json_schema"]
    name: SchemaName
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description=SCHEMA_DESCRIPTION)
    strict: bool | None = Field(None, description=STRICT_DESCRIPTION)


TextFormat = Annotated[
    Annotated[TextResponseFormat, Tag("type=text")]
    | Annotated[JsonObjectFormat, Tag("type=json_object")]
    | Annotated[TextJsonSchemaFormat, Tag("type=json_schema")],
    _discriminator(),
]
