"""One batch line: read it, turn its body into jobs as its ``url`` would, render its result.

A line's body is validated exactly like the same request sent to its endpoint directly, so a
batch accepts what the interactive routes accept and refuses the rest with the same error.
"""

from __future__ import annotations

from typing import Any

from trickle.events import TokenEvent
from trickle.jobs import BATCH_PRIORITY, Job
from web.admission.submission import prepare_job
from web.batches.store import BatchItem
from web.common.body import load_json
from web.common.chat_template import ChatTurn
from web.common.errors import HttpError, invalid
from web.openai import responses as shapes
from web.openai.requests import (
    OpenAIRequest,
    chat_prompt,
    parse_chat_request,
    parse_completion_request,
)
from web.openai.responses_api import render
from web.openai.responses_api.request import ResponseRequest, parse_response_request
from web.openai.responses_api.routes import conversation, record_of
from web.openai.routes import jobs_for_request
from web.services import Services

# Endpoints a file batch may name (the JSONL-body route takes the first two).
BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


def check_line_size(number: int, size: int, limit: int) -> None:
    """A line is a request body: past ``web.max_body_bytes`` it is refused, 413 naming
    ``line N``, as the same body sent to its endpoint would be (before it is parsed, let alone
    tokenized)."""
    if size > limit:
        raise HttpError(
            413,
            "request_too_large",
            f"line {number} is more than {limit} bytes; a batch line is a request body, "
            "limited as one (web.max_body_bytes)",
            f"line {number}",
        )


def parse_line(number: int, line: str, urls: tuple[str, ...]) -> BatchItem:
    """A line's envelope (custom_id, method, url, body); 400 naming ``line N.<field>``."""
    where = f"line {number}"
    data = load_json(line, where, where)
    if not isinstance(data, dict):
        raise invalid(where, f"{where} must be a JSON object")
    custom_id, method, url, body = (data.get(k) for k in ("custom_id", "method", "url", "body"))
    if not isinstance(custom_id, str) or not custom_id:
        raise invalid(f"{where}.custom_id", f"{where} needs a non-empty string custom_id")
    if method != "POST":
        raise invalid(f"{where}.method", f"{where}: method must be POST")
    if url not in urls:
        raise invalid(f"{where}.url", f"{where}: url must be one of {sorted(urls)}")
    if not isinstance(body, dict):
        raise invalid(f"{where}.body", f"{where}: body must be a JSON object")
    return BatchItem(custom_id=custom_id, url=url, body=body)


def failed_item(custom_id: str, url: str, error: HttpError) -> BatchItem:
    """A line refused on its own: it reaches the error file with the 4xx it earned."""
    item = BatchItem(custom_id=custom_id, url=url, body={})
    item.refuse(error.status, error.to_dict()["error"])
    return item


def parse_request(svc: Services, item: BatchItem) -> OpenAIRequest | ResponseRequest:
    """A line's body, validated like the same request sent to ``item.url`` directly."""
    if item.url == "/v1/responses":
        req: OpenAIRequest | ResponseRequest = parse_response_request(
            item.body, svc.settings, svc.requests.responses
        )
    elif item.url == "/v1/completions":
        req = parse_completion_request(item.body, svc.settings, svc.requests.completion)
    else:
        req = parse_chat_request(item.body, svc.settings, svc.requests.chat)
    if req.stream:
        raise invalid("body.stream", "batch requests cannot stream")
    return req


def jobs_for_item(
    svc: Services, item: BatchItem, result_ttl_seconds: int, shard: int | None = None
) -> list[Job]:
    """The line's jobs at batch priority, keeping their results ``result_ttl_seconds``
    (checked against the limits, not stored yet)."""
    req = parse_request(svc, item)
    if isinstance(req, ResponseRequest):
        system = [ChatTurn("system", req.instructions)] if req.instructions else []
        turns = [*system, *conversation(svc, req)]
        prompt = chat_prompt(turns, svc.settings, req.model, param="input")
        jobs = [prepare_job(svc, req.model, prompt, req.params, shard)]
    else:
        jobs = jobs_for_request(svc, req, priority=BATCH_PRIORITY, shard=shard)
    for job in jobs:
        job.priority = BATCH_PRIORITY
        job.result_ttl_seconds = result_ttl_seconds
    return jobs


def result_body(svc: Services, item: BatchItem, created_at: int, jobs: list[Job]) -> dict[str, Any]:
    """The body the line's endpoint would have answered, from its finished jobs (their token
    logs are read only for a request that asked for logprobs)."""
    req = parse_request(svc, item)
    if isinstance(req, ResponseRequest):
        job = jobs[0]
        record = record_of(req, job, req.messages)
        logprobs = svc.store.tokens(job.id) if req.logprobs else None
        return dict(render.response_object(record, job, render.status_of(job), logprobs))
    envelope = shapes.Envelope(item.job_ids[0], created_at, req.model, tuple(item.job_ids))
    finished: list[tuple[Job, list[TokenEvent]]] = [
        (job, svc.store.tokens(job.id) if req.logprobs is not None else []) for job in jobs
    ]
    return shapes.result_object(req, envelope, finished)
