"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API.

A message is one job, created and streamed as the OpenAI routes' are. A stream whose client
leaves cancels its job, unless the request carried an ``Idempotency-Key``: then the job runs on,
and the same request with the same key and ``Last-Event-ID: <n>`` (a delta's ``id``) resumes the
stream after token n, from the job's token log (or ``GET /v1/jobs/job_<hex>/events`` does, in
Trickle's own events).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import redis
from flask import Blueprint, Response, jsonify, request

from trickle.events import TokenRun
from trickle.jobs import Job, JobStatus
from web.admission.deadline import expired_error, with_deadline
from web.admission.idempotency import IDEMPOTENCY_HEADER, IdempotencyKey, earlier, requested_key
from web.admission.submission import admit, cancel_quietly, enqueue, prepare_job, tokenize_prompt
from web.anthropic import render
from web.anthropic.errors import error_event
from web.anthropic.models import messages_models
from web.anthropic.request import MessagesCall, check_version, parse_count, parse_messages
from web.anthropic.stream import TextWriter, ToolWriter
from web.anthropic.tool_blocks import blocks_of_whole_answer
from web.common.body import read_json_body
from web.common.errors import HttpError, invalid, not_found, unavailable
from web.common.server_timing import timing_comment, with_server_timing
from web.common.validation import parse_after
from web.services import Services, services
from web.streams.follow import Done, JobFollower, JobNotFound, KeepAlive, Status
from web.streams.follow_many import follow_many
from web.streams.job_wait import wait_for_job
from web.streams.routes import sse_response, stream_pace, waiting_comment

log = logging.getLogger(__name__)
blueprint = Blueprint("anthropic", __name__)
RESUME_HEADER = "Last-Event-ID"


@blueprint.post("/v1/messages")
def create_message() -> Response:
    svc = services()
    check_version()
    body = read_json_body()
    key = requested_key(body)
    call = parse_messages(body, svc.settings, messages_models(svc.settings).create)
    after = _resume_point(call, key)
    job = _submit(svc, call, key, resuming=after >= 0)
    if call.stream:
        return _event_stream(svc, job, call, after, cancel_on_close=key is None)
    done = wait_for_job(svc.store, svc.hub, job.id, svc.settings.web.completion_timeout_seconds)
    if done is None or not done.status.is_terminal:
        cancel_quietly(svc, [(job.id, job.model)])
        raise HttpError(504, "timeout", "generation did not finish in time", code="timeout")
    if done.status is JobStatus.FAILED:
        raise _failed(done)
    if done.status is JobStatus.EXPIRED:
        raise expired_error(done)
    parser = call.tools.new_parser() if call.tools is not None else None
    if parser is None:
        return with_server_timing(jsonify(render.message_object(done, call.model)), [done])
    blocks = blocks_of_whole_answer(done, parser)
    content, reason = blocks.content(), blocks.stop_reason(done)
    answer = jsonify(render.message_object(done, call.model, content=content, reason=reason))
    return with_server_timing(answer, [done])


@blueprint.post("/v1/messages/count_tokens")
def count_tokens() -> Response:
    svc = services()
    check_version()
    body = read_json_body()
    model, prompt = parse_count(body, svc.settings, messages_models(svc.settings).count_tokens)
    return jsonify({"input_tokens": len(tokenize_prompt(svc, model, prompt))})


def _resume_point(call: MessagesCall, key: IdempotencyKey | None) -> int:
    """The token a resumed stream starts after (-1: a new stream from its start)."""
    after = parse_after(request.headers.get(RESUME_HEADER), RESUME_HEADER)
    if after >= 0 and not call.stream:
        raise invalid(RESUME_HEADER, f"{RESUME_HEADER} resumes a stream: it needs stream: true")
    if after >= 0 and key is None:
        raise invalid(
            RESUME_HEADER,
            f"{RESUME_HEADER} resumes the stream of an earlier request: send "
            f"that request again with its {IDEMPOTENCY_HEADER}",
        )
    return after


def _submit(svc: Services, call: MessagesCall, key: IdempotencyKey | None, resuming: bool) -> Job:
    """The new job, or with an ``Idempotency-Key`` already used, the first request's. A resume
    whose key created nothing is a 404: a new stream begun after token n would lose 0..n."""
    first = earlier(svc, key)
    if first is None and resuming:
        raise not_found(
            f"no message to resume: this {IDEMPOTENCY_HEADER} has none (expired?)",
            IDEMPOTENCY_HEADER,
        )
    if first is None:
        job = prepare_job(svc, call.model, call.prompt, call.params, key.shard if key else None)
        with_deadline([job])
        admit(svc, [job])
        first = enqueue(svc, job, key)
        if first is None:
            return job
    found = svc.store.get(first.job_ids[0])
    if found is None:
        raise not_found(f"the message of this {IDEMPOTENCY_HEADER} has expired", IDEMPOTENCY_HEADER)
    return found


def _event_stream(
    svc: Services, job: Job, call: MessagesCall, after: int, cancel_on_close: bool
) -> Response:
    parser = call.tools.new_parser() if call.tools is not None else None
    writer: TextWriter | ToolWriter = TextWriter(job, call.model)
    if parser is not None:
        writer = ToolWriter(job, call.model, parser, after)
    try:
        # With tools the parser reads every token from the first, whatever the resume point.
        first = after if parser is None else -1
        follower = JobFollower(
            svc.store, svc.hub, job.id, first, job.tenant_digest, False, svc.waiting
        )
    except JobNotFound:
        raise not_found(
            f"message {render.message_id(job.id)!r} has expired", IDEMPOTENCY_HEADER
        ) from None
    return sse_response(_events(svc, job, writer, follower, cancel_on_close), follower.close)


def _events(
    svc: Services,
    job: Job,
    writer: TextWriter | ToolWriter,
    follower: JobFollower,
    cancel_on_close: bool,
) -> Iterator[str]:
    finished = False
    try:
        yield writer.head()
        pace = stream_pace(svc)
        for group in follow_many([follower], svc.settings.web.keepalive_seconds, pace):
            parts: list[str] = []  # one write per wake-up, however many tokens it brought
            for _index, event in group:
                if isinstance(event, KeepAlive):
                    parts.append(render.PING)
                elif isinstance(event, Status):
                    parts.append(waiting_comment(event))
                elif isinstance(event, TokenRun):
                    parts.extend(writer.tokens(event))
                elif isinstance(event, Done):
                    finished = True
                    if event.job.status is JobStatus.FAILED:
                        parts.append(error_event(_failed(event.job)))
                    elif event.job.status is JobStatus.EXPIRED:
                        parts.append(timing_comment([event.job]))  # its wait: admit, queue
                        parts.append(error_event(expired_error(event.job)))
                    else:
                        # Its hops, as a comment before its last events (clients skip it).
                        parts.append(timing_comment([event.job]))
                        parts.extend(writer.end(event.job))
            if parts:
                yield "".join(parts)
    except redis.RedisError as exc:
        log.warning("message stream %s ended: redis unavailable: %s", job.id, exc)
        yield error_event(unavailable(f"job store (Redis) unavailable: {exc}"))
    finally:
        if cancel_on_close and not finished:
            cancel_quietly(svc, [(job.id, job.model)])


def _failed(job: Job) -> HttpError:
    detail = job.error.message if job.error else "unknown error"
    return HttpError(500, "api_error", f"generation failed: {detail}", code="generation_failed")
