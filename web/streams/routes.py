"""Token streams over Server-Sent Events and WebSocket: thin formatting around ``JobFollower``.

If Redis goes away mid-stream the client gets an ``error`` event and the stream ends, instead of
a connection cut without explanation; it can resume with ``Last-Event-ID`` once Redis is back.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis
from flask import Flask, Response, request, stream_with_context
from simple_websocket import ConnectionClosed

from trickle.events import TokenRun
from trickle.jobs import Job, JobStatus
from web.admission.auth import current_tenant_digest
from web.common.errors import HttpError, not_found
from web.common.response_models import Queued
from web.common.validation import parse_after
from web.services import Services, services
from web.streams.follow import (
    Done,
    FollowEvent,
    JobFollower,
    JobNotFound,
    KeepAlive,
    Status,
    where_waiting,
)
from web.streams.websocket import BoundedServer, websocket_view

log = logging.getLogger(__name__)

# Every event stream (native and OpenAI): no caching, and no proxy buffering (nginx).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
WS_CLOSE_NOT_FOUND = 4404
WS_CLOSE_HTTP_BASE = 4000  # a refused request closes with 4000 + its HTTP status (4400, 4404)
WS_CLOSE_UNAVAILABLE = 1011


# Writes per second one web process spends on streams, whatever their number: each reader's
# least interval between chunks grows with the readers (10 ms floor, 250 ms at 5,000).
STREAM_WRITES_PER_SECOND = 20_000


def stream_pace(svc: Services) -> Callable[[], float]:
    floor = svc.settings.tuning.stream_flush_interval_ms / 1000

    def pace() -> float:
        return max(floor, svc.hub.active_subscriptions / STREAM_WRITES_PER_SECOND)

    return pace


def sse_response(body: Iterator[str], on_close: Callable[[], None]) -> Response:
    """An event stream's response; ``on_close`` runs even when the body never ran (the client
    left first): the server closes the response whatever became of its body."""
    response = Response(
        stream_with_context(body), mimetype="text/event-stream", headers=SSE_HEADERS
    )
    response.call_on_close(on_close)
    return response


def open_follower(job_id: str, after: int) -> JobFollower:
    svc = services()
    try:
        return JobFollower(
            svc.store, svc.hub, job_id, after, current_tenant_digest(), True, svc.waiting
        )
    except JobNotFound:
        raise not_found(f"job {job_id!r} does not exist or has expired", "job_id") from None


def unavailable_error(exc: Exception) -> dict[str, Any]:
    return {
        "type": "service_unavailable",
        "message": f"job store (Redis) unavailable: {exc}; reconnect to resume",
        "param": None,
    }


def sse_events(job_id: str) -> Response:
    header = request.headers.get("Last-Event-ID", "").strip()
    after = (
        parse_after(header, "Last-Event-ID")
        if header
        else parse_after(request.args.get("after"), "after")
    )
    follower = open_follower(job_id, after)
    settings = services().settings.web
    keepalive = settings.keepalive_seconds

    def body() -> Iterator[str]:
        yield "retry: 2000\n\n"
        chunks = follower.chunks(keepalive, stream_pace(services()))
        delivery = FirstDelivery(follower, "sse")
        try:
            for chunk in chunks:
                delivery.starting(chunk)
                yield "".join(format_sse(event) for event in chunk)
                delivery.written()
        except redis.RedisError as exc:
            log.warning("stream of %s ended: redis unavailable: %s", job_id, exc)
            yield f"event: error\ndata: {json.dumps({'error': unavailable_error(exc)})}\n\n"
        except GeneratorExit:  # the server closed the body early: the client went away
            log.info("event stream reader of %s left", job_id)
            raise
        finally:
            chunks.close()

    return sse_response(body(), follower.close)


def format_sse(event: FollowEvent) -> str:
    if isinstance(event, TokenRun):
        return tokens_sse(event)
    if isinstance(event, Done):
        return f"event: done\ndata: {json.dumps(event.job.to_dict(), ensure_ascii=False)}\n\n"
    if isinstance(event, KeepAlive):
        return ": keep-alive\n\n"
    if isinstance(event, Status):
        # No "id:" line: the browser's Last-Event-ID stays the last token index.
        return f"event: status\ndata: {json.dumps(status_data(event))}\n\n"
    raise TypeError(f"unknown event {event!r}")


def tokens_sse(run: TokenRun) -> str:
    """One ``token`` event per token, each text's literal written as the worker encoded it
    (the same bytes ``json.dumps`` of ``{"index", "text"}`` would give)."""
    return "".join(
        f'id: {index}\nevent: token\ndata: {{"index": {index}, "text": {literal}}}\n\n'
        for index, literal in enumerate(run.literals, run.first)
    )


def ws_frame(event: FollowEvent) -> str | None:
    """One WebSocket frame: a run of tokens is one ``token`` message, its texts joined,
    ``index`` its first token and ``count`` how many (the last one is index + count - 1)."""
    if isinstance(event, TokenRun):
        return (
            f'{{"event": "token", "index": {event.first}, "count": {len(event)}, '
            f'"text": {event.text_literal()}}}'
        )
    if isinstance(event, Done):
        return json.dumps({"event": "done", "job": event.job.to_dict()}, ensure_ascii=False)
    if isinstance(event, Status):
        return json.dumps({"event": "status", **status_data(event)})
    return None  # WebSocket keep-alive is the protocol's own ping


def status_data(event: Status) -> dict[str, Any]:
    """``{"status": …}``, plus ``position`` and ``eta_seconds`` (null when unknown) while
    queued."""
    data: dict[str, Any] = {"status": event.status.value}
    if event.status is JobStatus.QUEUED:
        data.update(queued_object(event.position, event.eta_seconds))
    return data


def rounded_eta(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 2)


def queued_fields(svc: Services, job: Job) -> Queued | None:
    """The ``queued`` object of a queued job's answer (GET job, Responses, batches); None once
    it left the queue."""
    if job.status is not JobStatus.QUEUED:
        return None
    found = where_waiting(svc.store, svc.waiting, job.id)
    return queued_object(found.position, found.eta_seconds)


def queued_object(position: int | None, eta_seconds: float | None) -> Queued:
    return {"position": position, "eta_seconds": rounded_eta(eta_seconds)}


def waiting_comment(event: Status) -> str:
    """A queued job's place as an SSE comment, for streams whose clients know no status
    event (OpenAI, Anthropic): their SSE decoders skip comments, and it keeps the stream alive.
    """
    position = "unknown" if event.position is None else event.position
    eta = rounded_eta(event.eta_seconds)
    return f": queued position={position} eta_seconds={'unknown' if eta is None else eta}\n\n"


class FirstDelivery:
    """Traces the write that carries a job's first token to this reader (when tracing is on)."""

    def __init__(self, follower: JobFollower, transport: str):
        tracing = services().tracing
        self._tracing = tracing if tracing.enabled and follower.trace_context else None
        self._traceparent = follower.trace_context
        self._transport = transport
        self._started: float | None = None

    def starting(self, chunk: list[FollowEvent]) -> None:
        if self._tracing is not None and any(
            isinstance(event, TokenRun) and event.first == 0 for event in chunk
        ):
            self._started = time.time()

    def written(self) -> None:
        if self._tracing is not None and self._started is not None:
            attributes = {"trickle.transport": self._transport}
            self._tracing.record(
                self._traceparent, "first delivery", self._started, time.time(), attributes
            )
            self._tracing = None  # once per stream


def register(app: Flask) -> None:
    app.add_url_rule("/v1/jobs/<job_id>/events", "job_events", sse_events, methods=["GET"])
    # websocket=True: the rule matches only upgrade requests (werkzeug answers others 400).
    app.add_url_rule(
        "/v1/jobs/<job_id>/ws", "job_ws", websocket_view(job_ws), methods=["GET"], websocket=True
    )


def job_ws(ws: BoundedServer, job_id: str) -> None:
    """After the upgrade nothing may answer in HTTP: every failure is an ``error`` event
    and a close code (4xxx for the client's mistakes), and a client leaving is no error."""
    follower = open_ws_follower(ws, job_id)
    if follower is None:
        return
    svc = services()
    chunks = follower.chunks(svc.settings.web.keepalive_seconds, stream_pace(svc))
    delivery = FirstDelivery(follower, "websocket")
    try:
        for chunk in chunks:
            if not ws.is_open:
                # The client left or was refused: a keep-alive writes nothing, so without this
                # a job that never moves would hold its reader (and subscription) for good.
                raise ConnectionClosed(ws.close_reason, ws.close_message)
            delivery.starting(chunk)
            frames = [frame for event in chunk if (frame := ws_frame(event)) is not None]
            for frame in frames:
                ws.send(frame)
            delivery.written()
        ws.close(reason=1000, message="done")
    except redis.RedisError as exc:
        close_with_error(ws, unavailable_error(exc), WS_CLOSE_UNAVAILABLE, "redis unavailable")
    except (ConnectionClosed, OSError) as exc:
        log.info("websocket reader of %s left: %s", job_id, type(exc).__name__)
    finally:
        chunks.close()
        follower.close()  # drop the hub subscription even when the client vanished


def open_ws_follower(ws: Any, job_id: str) -> JobFollower | None:
    """The follower for a WebSocket, or None after telling the client why not."""
    svc = services()
    try:
        after = parse_after(request.args.get("after"), "after")
        return JobFollower(
            svc.store, svc.hub, job_id, after, current_tenant_digest(), True, svc.waiting
        )
    except JobNotFound:
        error = {"type": "not_found", "message": f"job {job_id!r} does not exist"}
        close_with_error(ws, {**error, "param": "job_id"}, WS_CLOSE_NOT_FOUND, "job not found")
    except HttpError as exc:
        close_with_error(ws, exc.to_dict()["error"], WS_CLOSE_HTTP_BASE + exc.status, exc.type)
    except redis.RedisError as exc:
        close_with_error(ws, unavailable_error(exc), WS_CLOSE_UNAVAILABLE, "redis unavailable")
    return None


def close_with_error(ws: Any, error: dict[str, Any], code: int, reason: str) -> None:
    """An ``error`` event, then the close code; a client already gone is left alone."""
    try:
        ws.send(json.dumps({"event": "error", "error": error}, ensure_ascii=False))
        ws.close(reason=code, message=reason)
    except (ConnectionClosed, OSError):
        log.info("websocket client left before its error (%s) was sent", code)
