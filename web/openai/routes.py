"""OpenAI-compatible endpoints on the same queue: every choice of every request is a Trickle job.

``/v1/completions`` and ``/v1/chat/completions`` create one job per (prompt, n) choice, so the
workers, token stream and result store are exactly those of ``/v1/jobs`` and each job is visible
at ``/v1/jobs/<id>``. Streams are SSE ``data:`` lines; a client that disconnects cancels its jobs,
after a grace for its retry to re-attach when the request carries an Idempotency-Key
(web/streams/hold.py). A canceled job is never reported complete: its retry is a 409 and its
stream ends with an error event, never ``finish_reason: "stop"``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import redis
from flask import Blueprint, Response, jsonify, stream_with_context

from trickle.capacity import live_workers
from trickle.events import TokenEvent, TokenRun
from trickle.jobs import Job, JobStatus
from web.admission.deadline import expired_error, with_deadline
from web.admission.idempotency import IDEMPOTENCY_HEADER, IdempotencyKey, earlier, requested_key
from web.admission.submission import admit, cancel_quietly, enqueue_all, prepare_job
from web.common.body import read_json_body
from web.common.errors import HttpError, not_found, unavailable
from web.common.response_models import Model, ModelList
from web.common.server_timing import timing_comment, with_server_timing
from web.openai import responses as shapes
from web.openai.json_pieces import json_pieces
from web.openai.requests import (
    OpenAIRequest,
    RequestKind,
    parse_chat_request,
    parse_completion_request,
)
from web.openai.tool_chat import ToolChoiceStream
from web.services import Services, services
from web.streams import hold as stream_hold
from web.streams.follow import Done, JobFollower, KeepAlive, Status
from web.streams.follow_many import close_all, follow_many, open_followers
from web.streams.job_wait import wait_for_job
from web.streams.routes import sse_response, stream_pace, waiting_comment

log = logging.getLogger(__name__)
blueprint = Blueprint("openai", __name__)
STARTED_AT = int(time.time())
STARTED_AT_TEXT = datetime.fromtimestamp(STARTED_AT, UTC).isoformat().replace("+00:00", "Z")


@blueprint.get("/v1/models")
def list_models() -> Response:
    data = [_model_object(name) for name in services().settings.models]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    listing: ModelList = {
        "object": "list",
        "data": data,
        "has_more": False,
        "first_id": first,
        "last_id": last,
    }
    return jsonify(listing)


@blueprint.get("/v1/models/<path:model_id>")
def get_model(model_id: str) -> Response:
    if model_id not in services().settings.models:
        raise not_found(f"model {model_id!r} does not exist", "model", code="model_not_found")
    return jsonify(_model_object(model_id))


def _model_object(name: str) -> Model:
    """OpenAI's model object and Anthropic's, plus what a client needs to fill a form (each
    client ignores the fields it does not know)."""
    svc = services()
    settings = svc.settings
    ttl = settings.worker.heartbeat_ttl_seconds
    return {
        "id": name,
        "object": "model",
        "created": STARTED_AT,
        "owned_by": "trickle",
        "type": "model",
        "display_name": name,
        "created_at": STARTED_AT_TEXT,
        "default": name == settings.default_model,
        "workers": live_workers(svc.redis, name, ttl, time.time()),
        "max_context_tokens": settings.model(name).max_context_tokens,
        "max_prompt_tokens": settings.limits.max_prompt_tokens,
        "max_tokens": settings.limits.max_tokens_ceiling,
    }


@blueprint.post("/v1/completions")
def completions() -> Response:
    svc = services()
    body = read_json_body()
    key = requested_key(body)
    req = parse_completion_request(body, svc.settings, svc.requests.completion)
    return _respond(svc, req, key)


@blueprint.post("/v1/chat/completions")
def chat_completions() -> Response:
    svc = services()
    body = read_json_body()
    key = requested_key(body)
    return _respond(svc, parse_chat_request(body, svc.settings, svc.requests.chat), key)


def _respond(svc: Services, req: OpenAIRequest, key: IdempotencyKey | None) -> Response:
    jobs = _create_jobs(svc, req, key)
    envelope = shapes.Envelope(
        id=jobs[0].id, created=int(time.time()), model=req.model, job_ids=tuple(j.id for j in jobs)
    )
    if req.stream:
        tenant_digest = jobs[0].tenant_digest
        # Chunks carry no status: no status changes, and no queue position read as it starts;
        # while a job waits, comments say where it stands.
        job_ids = [job.id for job in jobs]
        followers = open_followers(svc.store, svc.hub, job_ids, tenant_digest, False, svc.waiting)
        held = key is not None and stream_hold.grace_seconds(svc) > 0
        events = _stream(svc, req, jobs, followers, envelope, held)
        return sse_response(events, lambda: close_all(followers))
    try:
        answer, ended = _complete(svc, req, jobs, envelope)
    except redis.RedisError as exc:  # the jobs exist: name them, so a retry need not copy them
        raise created_unavailable(jobs, exc) from exc
    # Written in pieces: with logprobs an answer may run to tens of MiB (web.openai.json_pieces).
    response = Response(stream_with_context(json_pieces(answer)), mimetype="application/json")
    return with_server_timing(response, ended)


def created_unavailable(jobs: list[Job], exc: Exception) -> HttpError:
    ids = [job.id for job in jobs]
    return unavailable(f"job store (Redis) unavailable after creating {', '.join(ids)}: {exc}", ids)


def _create_jobs(svc: Services, req: OpenAIRequest, key: IdempotencyKey | None) -> list[Job]:
    """Validate every choice first, then enqueue them all (all or nothing for bad input); with
    an idempotency key already used, the first request's jobs instead."""
    first = earlier(svc, key)
    if first is None:
        jobs = jobs_for_request(svc, req, shard=key.shard if key else None)
        with_deadline(jobs)
        admit(svc, jobs)
        first = enqueue_all(svc, jobs, key)
        if first is None:
            return jobs
    found = [svc.store.get(job_id) for job_id in first.job_ids]
    if not all(found):
        raise not_found("the jobs of this Idempotency-Key have expired", "Idempotency-Key")
    jobs = [job for job in found if job is not None]
    canceled = [job.id for job in jobs if job.status is JobStatus.CANCELED]
    if canceled:
        raise request_canceled(canceled)
    return jobs


def request_canceled(job_ids: list[str], param: str | None = IDEMPOTENCY_HEADER) -> HttpError:
    """The request's jobs were canceled (its client left and no retry came within
    ``web.stream_resume_grace_seconds``, or someone canceled them): their output is cut, so
    neither the request nor its retry may report it as a finished answer."""
    return HttpError(
        409,
        "invalid_request_error",
        f"the request was canceled before it finished ({', '.join(job_ids)}); its output is "
        f"incomplete. A retry with the same {IDEMPOTENCY_HEADER} gets this answer too: send it "
        "with a new key (or none) to run it again",
        param,
        code="request_canceled",
    )


def jobs_for_request(
    svc: Services, req: OpenAIRequest, priority: int = 0, shard: int | None = None
) -> list[Job]:
    """One job per choice (prompt x n), checked against the limits but not stored yet."""
    jobs = []
    for prompt_index, prompt in enumerate(req.prompts):
        for sample in range(req.n):
            params = req.params
            if params.seed is not None:
                # Each choice gets its own seed, derived so the whole request stays repeatable.
                choice = prompt_index * req.n + sample
                params = dataclasses.replace(params, seed=params.seed + choice)
            job = prepare_job(svc, req.model, prompt, params, shard)
            job.priority = priority
            jobs.append(job)
    return jobs


def _complete(
    svc: Services, req: OpenAIRequest, jobs: list[Job], envelope: shapes.Envelope
) -> tuple[dict[str, Any], list[Job]]:
    """The answer, and its jobs as they ended (their hops are its ``Server-Timing``)."""
    deadline = time.monotonic() + svc.settings.web.completion_timeout_seconds
    finished: list[tuple[Job, list[TokenEvent]]] = []
    for job in jobs:
        done = wait_for_job(svc.store, svc.hub, job.id, max(deadline - time.monotonic(), 0))
        if done is None or not done.status.is_terminal:
            cancel_quietly(svc, [(j.id, j.model) for j in jobs])
            raise HttpError(504, "timeout", "generation did not finish in time", code="timeout")
        if done.status is JobStatus.FAILED:
            cancel_quietly(svc, [(j.id, j.model) for j in jobs])
            raise _generation_failed(done)
        if done.status is JobStatus.EXPIRED:
            cancel_quietly(svc, [(j.id, j.model) for j in jobs])
            raise expired_error(done)
        if done.status is JobStatus.CANCELED:
            cancel_quietly(svc, [(j.id, j.model) for j in jobs])
            raise request_canceled([done.id], None)
        # The replay log only for logprobs: the finished job already holds its output.
        events = svc.store.tokens(job.id) if req.logprobs is not None else []
        finished.append((done, events))
    answer = shapes.result_object(req, envelope, finished, lazy=True)
    return answer, [done for done, _events in finished]


def _stream(
    svc: Services,
    req: OpenAIRequest,
    jobs: list[Job],
    followers: list[JobFollower],
    envelope: shapes.Envelope,
    held: bool = False,
) -> Iterator[str]:
    """``held``: the request carries an Idempotency-Key, so a client that leaves gets the
    grace to re-attach before its jobs are canceled (web/streams/hold.py)."""
    chat = req.kind is RequestKind.CHAT
    # Logprobs and continuous usage are per token; otherwise a wake-up's tokens are one chunk.
    per_token = req.logprobs is not None or req.continuous_usage
    templates = [shapes.text_chunk_template(envelope, i, chat) for i in range(len(jobs))]
    tools = _tool_streams(req, envelope, jobs)
    finished: set[int] = set()
    ended: list[Job] = []  # as they ended: the stream's last comment gives their hops
    offsets = [0] * len(jobs)
    generated = [0] * len(jobs)  # per choice, for continuous_usage_stats
    completion_tokens = 0

    def with_usage(chunk: dict[str, Any], index: int) -> dict[str, Any]:
        """vLLM's continuous_usage_stats: the choice's usage so far in every chunk."""
        if req.continuous_usage:
            chunk["usage"] = shapes.usage(jobs[index].usage.prompt_tokens, generated[index])
        return chunk

    left = False  # the client went away (not: the stream ended on its own)
    if held:
        stream_hold.attach(svc, jobs)
    try:
        for index, prompt in enumerate(shapes.choice_prompts(req)):
            if chat:
                yield _sse(shapes.chat_chunk(envelope, index, {"role": "assistant", "content": ""}))
            elif req.echo:
                offsets[index] = len(prompt)
                yield _sse(shapes.completion_chunk(envelope, index, prompt))
        pace = stream_pace(svc)
        for group in follow_many(followers, svc.settings.web.keepalive_seconds, pace):
            parts: list[str] = []  # one write per wake-up, however many tokens it brought
            for index, event in group:
                if isinstance(event, KeepAlive):
                    parts.append(": keep-alive\n\n")
                elif isinstance(event, Status):
                    parts.append(waiting_comment(event))
                elif isinstance(event, TokenRun) and tools:
                    # Token by token: a call's arguments stream as the model writes them.
                    for literal in event.literals:
                        generated[index] += 1
                        for chunk in tools[index].feed(json.loads(literal)):
                            parts.append(_sse(with_usage(chunk, index)))
                elif isinstance(event, TokenRun) and not per_token:
                    generated[index] += len(event)
                    literal = event.text_literal()
                    if literal != '""':  # held text (a partial character) is no chunk
                        parts.append(templates[index].render(literal))
                elif isinstance(event, TokenRun):
                    for token in event.events(jobs[index].id):
                        generated[index] += 1
                        chunk = _token_chunk(req, envelope, index, token, offsets[index])
                        parts.append(_sse(with_usage(chunk, index)))
                        offsets[index] += len(token.text)
                elif isinstance(event, Done):
                    finished.add(index)
                    job = event.job
                    ended.append(job)
                    if job.status in (JobStatus.FAILED, JobStatus.CANCELED, JobStatus.EXPIRED):
                        if job.status is JobStatus.FAILED:
                            error = _generation_failed(job)
                        elif job.status is JobStatus.EXPIRED:
                            error = expired_error(job)
                            parts.append(timing_comment([job]))  # its wait: admit, queue
                        else:
                            error = request_canceled([job.id], None)
                        parts.append(_sse(error.to_dict()))
                        yield "".join(parts)
                        return
                    completion_tokens += job.usage.completion_tokens
                    reason = shapes.finish_reason(job)
                    if tools:
                        *pending, last = tools[index].finish(job)
                        parts.extend(_sse(with_usage(chunk, index)) for chunk in pending)
                    elif chat:
                        last = shapes.chat_chunk(envelope, index, {}, reason)
                    else:
                        last = shapes.completion_chunk(envelope, index, "", reason)
                    parts.append(_sse(with_usage(last, index)))
            if parts:
                yield "".join(parts)
        if req.include_usage:
            kind = "chat.completion.chunk" if chat else "text_completion"
            usage = shapes.usage(shapes.prompt_tokens(req, jobs), completion_tokens)
            yield _sse(shapes.usage_chunk(envelope, kind, usage))
        yield timing_comment(ended) + "data: [DONE]\n\n"
    except redis.RedisError as exc:
        log.warning("completion stream %s ended: redis unavailable: %s", envelope.id, exc)
        yield _sse(created_unavailable(jobs, exc).to_dict())
    except GeneratorExit:  # the server closed the body early: the client went away
        left = True
        log.info("completion stream %s: the client left", envelope.id)
        raise
    finally:
        # The client went away (or generation failed): stop what still runs (a flush and a
        # step); a keyed request's client that left first gets the grace to come back.
        unfinished = [job for index, job in enumerate(jobs) if index not in finished]
        if held:
            try:
                stream_hold.detach(svc, jobs, unfinished, left)
            except redis.RedisError as exc:
                log.warning("completion stream %s: could not hold its jobs: %s", envelope.id, exc)
                left = False
        if not (held and left):
            cancel_quietly(svc, [(job.id, job.model) for job in unfinished])


def _tool_streams(
    req: OpenAIRequest, envelope: shapes.Envelope, jobs: list[Job]
) -> list[ToolChoiceStream]:
    """A parser per choice when the answers may hold tool calls; none otherwise."""
    if req.tools is None:
        return []
    streams = []
    for index, job in enumerate(jobs):
        parser = req.tools.new_parser()
        if parser is None:
            return []
        streams.append(ToolChoiceStream(envelope, index, job.id, parser))
    return streams


def _token_chunk(
    req: OpenAIRequest, envelope: shapes.Envelope, index: int, event: TokenEvent, offset: int
) -> dict[str, Any]:
    if req.kind is RequestKind.CHAT:
        logprobs = None
        if req.logprobs is not None:
            logprobs = shapes.chat_logprobs([event], req.logprobs)
        return shapes.chat_chunk(envelope, index, {"content": event.text}, logprobs=logprobs)
    logprobs = shapes.completion_logprobs([event], offset) if req.logprobs is not None else None
    return shapes.completion_chunk(envelope, index, event.text, logprobs=logprobs)


def _generation_failed(job: Job) -> HttpError:
    detail = job.error.message if job.error else "unknown error"
    return HttpError(500, "server_error", f"generation failed: {detail}", code="generation_failed")


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
