"""The served OpenAPI document and the validator cannot disagree: every example in the document
is accepted, every field the validator accepts is in the document, and fields outside it (the
ones the hand-written validator once let through) are refused by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask

from trickle.config.settings import Settings
from web.anthropic.models import messages_models
from web.api_schema import component_schemas
from web.common.request_models import RequestModels
from web.common.validation import validate

OPERATIONS = {
    "JobRequest": "/v1/jobs",
    "CompletionRequest": "/v1/completions",
    "ChatCompletionRequest": "/v1/chat/completions",
    "ResponseCreateRequest": "/v1/responses",
    "MessagesRequest": "/v1/messages",
    "CountTokensRequest": "/v1/messages/count_tokens",
}
ANTHROPIC = ("MessagesRequest", "CountTokensRequest")
# Each was accepted by the hand-written validator while the published schema forbade it.
ONCE_DRIFTED = {
    "metadata": {"a": "b"},
    "store": False,
    "service_tier": "auto",
    "suffix": "",
    "best_of": 1,
    "logit_bias": {},
    "tools": [],
    "tool_choice": "none",
    "response_format": {"type": "text"},
    "parallel_tool_calls": False,
}


@pytest.fixture(scope="module")
def document(settings: Settings, make_app: Callable[[Settings], Flask]) -> dict[str, Any]:
    response = make_app(settings).test_client().get("/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.get_json()
    return document


@pytest.fixture(scope="module")
def models(settings: Settings) -> RequestModels:
    return RequestModels.bound_to(settings)


# A component's name is API (clients generate types from it): renaming a class in Python must not
# rename its schema (web.common.response_models.PUBLISHED_NAMES keeps the published one).
PUBLISHED_SCHEMAS = {
    *("JobRequest", "CompletionRequest", "ChatCompletionRequest", "ResponseCreateRequest"),
    *("ChatMessage", "InputMessage", "InputText", "ResponseStreamOptions"),
    *("StreamOptions", "TextConfig", "TextPart", "TextResponseFormat", "JsonObjectFormat"),
    *("JsonSchemaFormat", "JsonSchemaSpec", "TextJsonSchemaFormat", "NamedFunctionChoice"),
    *("Job", "JobUrls", "JobErrorObject", "JobMetrics", "JobStatus", "FinishReason"),
    "Queued",
    *("ParamsObject", "UsageObject", "Error", "ErrorDetail"),
    *("Completion", "CompletionChoice", "ChatCompletion", "ChatChoice", "AssistantMessage"),
    *("Usage", "Model", "ModelList", "Batch", "RequestCounts"),
    *("BatchList", "BatchError", "BatchErrors", "File", "FileList", "FileDeleted"),
    *("Response", "ResponseDeleted", "ResponseError", "ResponseUsage", "IncompleteDetails"),
    *("InputTokensDetails", "OutputTokensDetails", "OutputLogprob", "TopLogprob"),
    *("OutputMessage", "OutputText", "ReasoningConfig", "ResponseTextConfig", "ResponseTextFormat"),
    *("ChatTool", "FunctionDefinition", "ChatNamedToolChoice", "FunctionName", "ChatToolCall"),
    *("CalledFunction", "FunctionTool", "ResponsesNamedToolChoice", "FunctionCallItem"),
    *("FunctionCallOutputItem", "AssistantToolMessage", "MessageToolCall", "MessageFunction"),
    "OutputFunctionCall",
    *("MessagesRequest", "CountTokensRequest", "AnthropicMessage", "AnthropicTextBlock"),
    *("AnthropicCacheControl", "AnthropicMetadata", "AnthropicToolChoice", "Message"),
    *("MessageTokensCount", "AnthropicTextContent", "AnthropicUsage", "AnthropicError"),
    *("AnthropicErrorDetail", "AnthropicTool", "AnthropicToolUseBlock"),
    *("AnthropicToolResultBlock", "AnthropicToolUseContent"),
}


def model_for(models: RequestModels, name: str, settings: Settings) -> Any:
    messages = messages_models(settings)
    named = {
        "JobRequest": models.job,
        "CompletionRequest": models.completion,
        "ResponseCreateRequest": models.responses,
        "MessagesRequest": messages.create,
        "CountTokensRequest": messages.count_tokens,
    }
    return named.get(name, models.chat)


def test_the_document_is_openapi_3_1_with_generated_request_schemas(
    document: dict[str, Any],
) -> None:
    assert document["openapi"] == "3.1.0"
    for schema in OPERATIONS:
        assert document["components"]["schemas"][schema]["additionalProperties"] is False


@pytest.mark.parametrize("schema", sorted(OPERATIONS))
def test_every_example_in_the_document_validates(
    document: dict[str, Any], models: RequestModels, settings: Settings, schema: str
) -> None:
    examples = document["components"]["schemas"][schema]["examples"]
    assert examples
    for example in examples:
        validate(model_for(models, schema, settings), example)  # raises HttpError (400) if refused


@pytest.mark.parametrize("schema", sorted(OPERATIONS))
def test_every_accepted_field_is_documented_and_no_other(
    document: dict[str, Any], models: RequestModels, settings: Settings, schema: str
) -> None:
    documented = set(document["components"]["schemas"][schema]["properties"])
    model = model_for(models, schema, settings)
    assert set(model.model_fields) == documented
    if schema in ANTHROPIC:
        return  # the drifted fields are OpenAI's, in OpenAI's shapes
    minimal = document["components"]["schemas"][schema]["examples"][0]
    for name in ("max_token", "frequency", "prompt_ids", "best_of", "suffix", *ONCE_DRIFTED):
        body = {**minimal, name: ONCE_DRIFTED.get(name, 1)}
        try:
            validate(model, body)
            accepted = True
        except Exception as exc:  # HttpError: the field must be the one named
            assert getattr(exc, "param", None) == name, exc
            accepted = False
        assert accepted == (name in documented), name


def test_every_schema_keeps_its_published_name(models: RequestModels, settings: Settings) -> None:
    schemas = component_schemas(models, messages_models(settings).all())
    assert set(schemas) == PUBLISHED_SCHEMAS
    assert schemas["Usage"]["title"] == "Usage"  # the class is CompletionUsage


def test_the_job_api_refuses_openai_only_fields_by_name(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    client = make_app(settings).test_client()
    for name, value in ONCE_DRIFTED.items():
        response = client.post("/v1/jobs", json={"prompt": "x", name: value})
        assert response.status_code == 400
        assert response.get_json()["error"]["param"] == name


def test_a_non_string_user_is_refused(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    client = make_app(settings).test_client()
    body = {"prompt": "x", "user": 5}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.get_json()["error"]["param"] == "user"
