"""Token streams over Server-Sent Events and WebSocket: thin formatting around ``JobFollower``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from flask import Flask, Response, request, stream_with_context
from flask_sock import Sock

from web.errors import not_found
from web.follow import Done, FollowEvent, JobFollower, JobNotFound, KeepAlive
from web.services import services
from web.validation import parse_after
from worker.events import TokenEvent

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}
WS_CLOSE_NOT_FOUND = 4404


def open_follower(job_id: str, after: int) -> JobFollower:
    svc = services()
    try:
        return JobFollower(svc.store, svc.hub, job_id, after)
    except JobNotFound:
        raise not_found(f"job {job_id!r} does not exist or has expired", "job_id") from None


def sse_events(job_id: str) -> Response:
    header = request.headers.get("Last-Event-ID")
    after = (
        parse_after(header, "Last-Event-ID")
        if header is not None
        else parse_after(request.args.get("after"), "after")
    )
    follower = open_follower(job_id, after)
    keepalive = services().settings.web.keepalive_seconds

    def body() -> Iterator[str]:
        yield "retry: 2000\n\n"
        for event in follower.events(keepalive):
            yield format_sse(event)

    return Response(stream_with_context(body()), mimetype="text/event-stream", headers=SSE_HEADERS)


def format_sse(event: FollowEvent) -> str:
    if isinstance(event, TokenEvent):
        data = json.dumps(event.to_dict(), ensure_ascii=False)
        return f"id: {event.index}\nevent: token\ndata: {data}\n\n"
    if isinstance(event, Done):
        return f"event: done\ndata: {json.dumps(event.job.to_dict(), ensure_ascii=False)}\n\n"
    if isinstance(event, KeepAlive):
        return ": keep-alive\n\n"
    raise TypeError(f"unknown event {event!r}")


def ws_message(event: FollowEvent) -> dict[str, Any] | None:
    if isinstance(event, TokenEvent):
        return {"event": "token", **event.to_dict()}
    if isinstance(event, Done):
        return {"event": "done", "job": event.job.to_dict()}
    return None  # WebSocket keep-alive is the protocol's own ping


def register(app: Flask) -> None:
    app.add_url_rule("/v1/jobs/<job_id>/events", "job_events", sse_events, methods=["GET"])
    sock = Sock(app)

    @sock.route("/v1/jobs/<job_id>/ws")
    def job_ws(ws: Any, job_id: str) -> None:
        svc = services()
        try:
            after = parse_after(request.args.get("after"), "after")
            follower = JobFollower(svc.store, svc.hub, job_id, after)
        except JobNotFound:
            error = {
                "type": "not_found",
                "message": f"job {job_id!r} does not exist",
                "param": "job_id",
            }
            ws.send(json.dumps({"event": "error", "error": error}))
            ws.close(reason=WS_CLOSE_NOT_FOUND, message="job not found")
            return
        events = follower.events(svc.settings.web.keepalive_seconds)
        try:
            for event in events:
                message = ws_message(event)
                if message is not None:
                    ws.send(json.dumps(message, ensure_ascii=False))
        finally:
            events.close()  # drop the hub subscription even when the client vanished
        ws.close(reason=1000, message="done")
