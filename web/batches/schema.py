"""The OpenAPI paths of OpenAI's Batch and Files APIs (``web.api_schema`` assembles them)."""

from __future__ import annotations

from web.batches.file_store import UPLOAD_PURPOSES
from web.batches.input_file import (
    COMPLETION_WINDOWS,
    MAX_BATCH_METADATA_PAIRS,
    MAX_METADATA_KEY,
    MAX_METADATA_VALUE,
)
from web.batches.lines import BATCH_ENDPOINTS
from web.common.openapi_parts import (
    JSON,
    JSONL,
    Part,
    json_ok,
    links,
    optional_param,
    path_param,
    ref,
    reply,
    responses,
)

# The request OpenAI's client sends to create a batch from an uploaded file.
BATCH_CREATE_SCHEMA: Part = {
    "type": "object",
    "required": ["input_file_id", "endpoint", "completion_window"],
    "additionalProperties": False,
    "properties": {
        "input_file_id": {"type": "string", "description": "a file uploaded with purpose batch"},
        "endpoint": {"type": "string", "enum": list(BATCH_ENDPOINTS)},
        "completion_window": {"type": "string", "enum": list(COMPLETION_WINDOWS)},
        "metadata": {
            "type": ["object", "null"],
            "maxProperties": MAX_BATCH_METADATA_PAIRS,
            "propertyNames": {"maxLength": MAX_METADATA_KEY},
            "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE},
        },
    },
}
MULTIPART = "multipart/form-data"


def batch_paths() -> Part:
    batch_id = path_param("batch_id")
    batch_links = links(
        "batch_id", "$response.body#/id", "getBatch", "getBatchOutput", "cancelBatch"
    )
    the_batch = {"200": json_ok("The batch", ref("Batch"))}
    output = reply("One JSON object per line", {JSONL: {"schema": {"type": "string"}}})
    jsonl_file = {
        "type": "object",
        "required": ["file"],
        "properties": {"file": {"type": "string", "format": "binary"}},
    }
    return {
        "/v1/batches": {
            "post": {
                "operationId": "createBatch",
                "summary": "A batch from an uploaded file (input_file_id, as OpenAI's client "
                "sends it), or from OpenAI Batch input (JSONL lines with custom_id, method, "
                "url, body) as the body or an uploaded file, stored as its input file; "
                "answers validating, the batch consumer reads it; runs at batch priority",
                "requestBody": {
                    "required": True,
                    "content": {
                        JSON: {"schema": BATCH_CREATE_SCHEMA},
                        JSONL: {"schema": {"type": "string"}},
                        MULTIPART: {"schema": jsonl_file},
                    },
                },
                "responses": responses(
                    {"200": json_ok("The batch", ref("Batch"), batch_links)}, 400, 404, 413, 429
                ),
            },
            "get": {
                "operationId": "listBatches",
                "summary": "The caller's batches, newest first, a page at a time",
                "parameters": _page_params(100),
                "responses": responses({"200": json_ok("A page", ref("BatchList"))}, 400),
            },
        },
        "/v1/batches/{batch_id}": {
            "get": {
                "operationId": "getBatch",
                "summary": "The batch, from its record alone (counts as its tasks last kept them)",
                "parameters": [batch_id],
                "responses": responses(the_batch, 404),
            }
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": {
                "operationId": "cancelBatch",
                "parameters": [batch_id],
                "responses": responses(the_batch, 404),
            }
        },
        "/v1/batches/{batch_id}/output": {
            "get": {
                "operationId": "getBatchOutput",
                "summary": "OpenAI Batch output JSONL for the requests finished so far",
                "parameters": [batch_id],
                "responses": responses({"200": output}, 404),
            }
        },
    }


def file_paths() -> Part:
    file_id = path_param("file_id")
    file_links = links("file_id", "$response.body#/id", "getFile", "getFileContent", "deleteFile")
    upload = {
        "type": "object",
        "required": ["file", "purpose"],
        "properties": {
            "file": {"type": "string", "format": "binary"},
            "purpose": {"type": "string", "enum": list(UPLOAD_PURPOSES)},
        },
    }
    content = reply(
        "The file's bytes", {"application/octet-stream": {"schema": {"type": "string"}}}
    )
    return {
        "/v1/files": {
            "post": {
                "operationId": "createFile",
                "summary": "Upload a file (kept files.retention_seconds, owned by the key)",
                "requestBody": {"required": True, "content": {MULTIPART: {"schema": upload}}},
                "responses": responses(
                    {"200": json_ok("The file", ref("File"), file_links)}, 400, 413
                ),
            },
            "get": {
                "operationId": "listFiles",
                "summary": "The caller's files, a page at a time",
                "parameters": [
                    *_page_params(10_000),
                    optional_param("query", "purpose", {"type": "string"}),
                    optional_param("query", "order", {"type": "string", "enum": ["asc", "desc"]}),
                ],
                "responses": responses({"200": json_ok("A page", ref("FileList"))}, 400),
            },
        },
        "/v1/files/{file_id}": {
            "get": {
                "operationId": "getFile",
                "parameters": [file_id],
                "responses": responses({"200": json_ok("The file", ref("File"))}, 404),
            },
            "delete": {
                "operationId": "deleteFile",
                "parameters": [file_id],
                "responses": responses({"200": json_ok("Deleted", ref("FileDeleted"))}, 404),
            },
        },
        "/v1/files/{file_id}/content": {
            "get": {
                "operationId": "getFileContent",
                "parameters": [file_id],
                "responses": responses({"200": content}, 404),
            }
        },
    }


def _page_params(most: int) -> list[Part]:
    return [
        optional_param("query", "limit", {"type": "integer", "minimum": 1, "maximum": most}),
        optional_param(
            "query", "after", {"type": "string"}, "the id of the last object of the page before"
        ),
    ]
