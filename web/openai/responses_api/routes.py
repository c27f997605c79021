"""OpenAI's Responses API on the job queue: a response is one Trickle job plus a stored record.

``background: true`` returns at once; ``GET /v1/responses/<id>?stream=true&starting_after=N``
replays the response's events from N+1, while it runs or after it ended, across a worker's
crash: the events are numbered from the job's token log (``render``), so a reconnect sees exactly
the events it missed. A foreground stream whose client leaves cancels the job; a background one
runs on.
"""

from __future__ import annotations

import logging

from flask import Blueprint, Response, jsonify, request

from trickle.jobs import Job
from web.admission.auth import current_tenant_digest
from web.admission.deadline import with_deadline
from web.admission.idempotency import IdempotencyKey, earlier, requested_key
from web.admission.submission import admit, cancel_quietly, enqueue, prepare_job
from web.common.body import read_json_body
from web.common.chat_template import ChatTurn, TurnCall
from web.common.errors import HttpError, invalid, not_found
from web.common.server_timing import with_server_timing
from web.common.tools.calls import call_id
from web.openai.requests import chat_prompt
from web.openai.responses_api import render, tool_events
from web.openai.responses_api.event_stream import (
    event_stream,
    last_event,
    starting_after,
    tool_parser,
)
from web.openai.responses_api.models import ResponseObject
from web.openai.responses_api.request import ResponseRequest, parse_response_request
from web.openai.responses_api.store import StoredResponse, response_id_for
from web.services import Services, services
from web.streams import hold as stream_hold
from web.streams.follow import owned_by
from web.streams.job_wait import wait_for_job
from web.streams.routes import queued_fields

log = logging.getLogger(__name__)
blueprint = Blueprint("responses", __name__)

# How long a cancel waits for a running job to stop (a token flush and a step) before answering.
CANCEL_WAIT_SECONDS = 5.0


@blueprint.post("/v1/responses")
def create_response() -> Response:
    svc = services()
    body = read_json_body()
    key = requested_key(body)
    req = parse_response_request(body, svc.settings, svc.requests.responses)
    record, job = _submit(svc, req, key)
    if req.stream:
        # A keyed foreground stream whose client leaves gets the grace to re-attach: its
        # retry replays from the first event (web/streams/hold.py).
        held = key is not None and not req.background and stream_hold.grace_seconds(svc) > 0
        return event_stream(svc, record, job, -1, cancel_on_close=not req.background, held=held)
    if req.background:
        return jsonify(render.response_object(record, job, "queued"))
    done = wait_for_job(svc.store, svc.hub, job.id, svc.settings.web.completion_timeout_seconds)
    if done is None or not done.status.is_terminal:
        cancel_quietly(svc, [(job.id, job.model)])
        raise HttpError(504, "timeout", "generation did not finish in time", code="timeout")
    return with_server_timing(jsonify(_object(svc, record, done)), [done])


@blueprint.get("/v1/responses/<response_id>")
def get_response(response_id: str) -> Response:
    svc = services()
    record, job = _visible(svc, response_id)
    _flag("include_obfuscation")
    if not _flag("stream"):
        found = _object(svc, record, job)
        queued = queued_fields(svc, job)  # a background response still waiting for a worker
        if queued is not None:
            found["queued"] = queued
        return with_server_timing(jsonify(found), [job], delivered=False)
    after = starting_after(request.args.get("starting_after"))
    if job.status.is_terminal:
        last = last_event(svc, record, job)
        if after > last:
            raise invalid("starting_after", f"starting_after is past the last event ({last})")
    return event_stream(svc, record, job, after, cancel_on_close=False)


@blueprint.post("/v1/responses/<response_id>/cancel")
def cancel_response(response_id: str) -> Response:
    svc = services()
    record, job = _visible(svc, response_id)
    if not job.status.is_terminal:
        cancel_quietly(svc, [(job.id, job.model)])
        job = wait_for_job(svc.store, svc.hub, job.id, CANCEL_WAIT_SECONDS) or job
    return jsonify(_object(svc, record, job))


@blueprint.delete("/v1/responses/<response_id>")
def delete_response(response_id: str) -> Response:
    svc = services()
    record, job = _visible(svc, response_id)
    if not job.status.is_terminal:
        cancel_quietly(svc, [(job.id, job.model)])
    svc.responses.delete(record.id)
    return jsonify({"id": record.id, "object": "response", "deleted": True})


def _submit(
    svc: Services, req: ResponseRequest, key: IdempotencyKey | None
) -> tuple[StoredResponse, Job]:
    """The conversation through the model's template, then the job; the record is stored
    before the job is queued, so a client that polls at once finds it. With an
    ``Idempotency-Key`` already used, the first request's response instead."""
    first = earlier(svc, key)
    if first is None:
        messages = conversation(svc, req)
        system = [ChatTurn("system", req.instructions)] if req.instructions else []
        turns = [*system, *messages]
        prompt = chat_prompt(turns, svc.settings, req.model, param="input", tools=req.tools)
        job = prepare_job(svc, req.model, prompt, req.params, key.shard if key else None)
        with_deadline([job])
        admit(svc, [job])
        record = record_of(req, job, messages)
        if req.store:
            svc.responses.save(record)
        try:
            first = enqueue(svc, job, key)
        except BaseException:
            svc.responses.delete(record.id)  # nothing was created
            raise
        if first is None:
            return record, job
        svc.responses.delete(record.id)  # a concurrent request with the key created first
    return _created_earlier(svc, first.job_ids[0])


def _created_earlier(svc: Services, job_id: str) -> tuple[StoredResponse, Job]:
    record = svc.responses.load(response_id_for(job_id))
    job = svc.store.get(job_id)
    if record is None or job is None:
        message = "the response of this Idempotency-Key was not stored (store: false) or expired"
        raise not_found(message, "Idempotency-Key")
    return record, job


def record_of(req: ResponseRequest, job: Job, messages: tuple[ChatTurn, ...]) -> StoredResponse:
    return StoredResponse(
        id=response_id_for(job.id),
        job_id=job.id,
        tenant_digest=job.tenant_digest,
        model=req.model,
        created_at=int(job.created_at),
        messages=messages,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        temperature=req.params.temperature,
        top_p=req.params.top_p,
        metadata=req.metadata,
        previous_response_id=req.previous_response_id,
        background=req.background,
        store=req.store,
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs,
        parallel_tool_calls=req.parallel_tool_calls,
        tool_choice=req.tool_choice,
        tools=req.tool_echo,
        tool_parser=req.tools.parser if req.tools is not None else None,
        text_format=req.text_format,
    )


def conversation(svc: Services, req: ResponseRequest) -> tuple[ChatTurn, ...]:
    """The previous response's conversation and answer, then this request's input."""
    if req.previous_response_id is None:
        return req.messages
    param = "previous_response_id"
    previous = svc.responses.load(req.previous_response_id)
    if previous is None or not owned_by(previous.tenant_digest, current_tenant_digest()):
        raise not_found(f"response {req.previous_response_id!r} does not exist", param)
    job = svc.store.get(previous.job_id)
    if job is None:
        raise not_found(f"response {req.previous_response_id!r} has expired", param)
    if not job.status.is_terminal:
        raise invalid(param, f"response {previous.id!r} is still {render.status_of(job)}")
    return (*previous.messages, _answer_turn(previous, job), *req.messages)


def _answer_turn(record: StoredResponse, job: Job) -> ChatTurn:
    """A finished response's answer as the next turn's assistant message, its calls included."""
    tools = record.tool_use()
    answer = tools.parse(job.output) if tools is not None else None
    if answer is None:
        return ChatTurn("assistant", job.output)
    calls = tuple(
        TurnCall(call_id(job.id, index), call.name, call.arguments)
        for index, call in enumerate(answer.calls)
    )
    return ChatTurn("assistant", answer.content, calls)


def _visible(svc: Services, response_id: str) -> tuple[StoredResponse, Job]:
    """The caller's stored response and its job; 404 for unknown, expired or another key's."""
    record = svc.responses.load(response_id)
    if record is None or not owned_by(record.tenant_digest, current_tenant_digest()):
        raise not_found(f"response {response_id!r} does not exist", "response_id")
    job = svc.store.get(record.job_id)
    if job is None:
        svc.responses.delete(record.id)
        raise not_found(f"response {response_id!r} has expired", "response_id")
    return record, job


def _object(svc: Services, record: StoredResponse, job: Job) -> ResponseObject:
    parser = tool_parser(record)
    if parser is not None:
        return tool_events.read_whole(record, parser, job).response(job, render.status_of(job))
    logprobs = svc.store.tokens(job.id) if record.logprobs and job.status.is_terminal else None
    return render.response_object(record, job, render.status_of(job), logprobs)


def _flag(name: str) -> bool:
    raw = request.args.get(name)
    if raw is None or raw in ("false", "0"):
        return False
    if raw in ("true", "1"):
        return True
    raise invalid(name, f"{name} must be true or false")
