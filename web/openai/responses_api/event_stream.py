"""A response's event stream: its events from a sequence number on, live or replayed.

The events are numbered from the job's token log (``render``; ``tool_events`` for a response
with tools), so a reconnect with ``starting_after`` sees exactly the events it missed, while the
job runs or after it ended, across a worker's crash.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import redis
from flask import Response

from trickle.events import TokenRun
from trickle.jobs import Job
from web.admission.submission import cancel_quietly
from web.common.errors import invalid, not_found, unavailable
from web.common.server_timing import timing_comment
from web.common.tools.parser import ToolCallParser
from web.openai.responses_api import render, tool_events
from web.openai.responses_api.store import StoredResponse
from web.services import Services
from web.streams import hold as stream_hold
from web.streams.follow import Done, JobFollower, JobNotFound, KeepAlive, Status
from web.streams.follow_many import follow_many
from web.streams.routes import sse_response, stream_pace, waiting_comment
from web.streams.sse_events import typed_event

log = logging.getLogger(__name__)


def starting_after(raw: str | None) -> int:
    if raw is None or raw == "":
        return -1
    try:
        after = int(raw)
    except ValueError as exc:
        raise invalid("starting_after", "starting_after must be an integer") from exc
    if after < 0:
        raise invalid("starting_after", "starting_after must be a sequence number (>= 0)")
    return after


def tool_parser(record: StoredResponse) -> ToolCallParser | None:
    tools = record.tool_use()
    return None if tools is None else tools.new_parser()


def last_event(svc: Services, record: StoredResponse, job: Job) -> int:
    """The sequence number of a finished response's last event."""
    parser = tool_parser(record)
    if parser is None:
        return render.HEAD_EVENTS + svc.responses.token_count(job.id) + render.TAIL_EVENTS - 1
    events = tool_events.ToolEvents(record, parser)
    for token in svc.store.tokens(job.id):
        events.token(token.text)
    events.end(job)
    return events.sequence - 1


def event_stream(
    svc: Services,
    record: StoredResponse,
    job: Job,
    after: int,
    cancel_on_close: bool,
    held: bool = False,
) -> Response:
    # A tool response's events are rebuilt from its first token (tool_events).
    first_token = max(after - render.HEAD_EVENTS, -1) if record.tool_parser is None else -1
    try:
        follower = JobFollower(
            svc.store, svc.hub, job.id, first_token, job.tenant_digest, False, svc.waiting
        )
    except JobNotFound:
        raise not_found(f"response {record.id!r} has expired", "response_id") from None
    hold = job if held else None
    events = _events(svc, record, follower, after, cancel_on_close, hold)
    return sse_response(events, follower.close)


def _events(
    svc: Services,
    record: StoredResponse,
    follower: JobFollower,
    after: int,
    cancel_on_close: bool,
    hold: Job | None = None,
) -> Iterator[str]:
    """Every event numbered above ``after``, as it becomes known; ``hold``: the job of a keyed
    stream, held for the grace instead of canceled when the client leaves."""
    parser = tool_parser(record)
    if parser is not None:
        yield from _tool_events(svc, record, follower, after, cancel_on_close, parser, hold)
        return
    template = render.DeltaTemplate(record)

    def head() -> list[str]:
        return [typed_event(e) for e in render.head_events(record) if e["sequence_number"] > after]

    def run(event: TokenRun) -> list[str]:
        if record.logprobs:
            return [render.delta_event(record, t) for t in event.events(record.job_id)]
        return [template.render(event.first, event.literals)]

    def done(job: Job) -> list[str]:
        return _tail(svc, record, job, after)

    yield from _framed(svc, record, follower, cancel_on_close, hold, head, run, done)


def _tool_events(
    svc: Services,
    record: StoredResponse,
    follower: JobFollower,
    after: int,
    cancel_on_close: bool,
    parser: ToolCallParser,
    hold: Job | None = None,
) -> Iterator[str]:
    """A tool response's events above ``after``: the parser reads every token from the first.
    ``hold`` as in ``_events``."""
    events = tool_events.ToolEvents(record, parser)

    def newer(made: list[dict[str, Any]]) -> list[str]:
        return [typed_event(e) for e in made if e["sequence_number"] > after]

    def run(event: TokenRun) -> list[str]:
        return [
            part for literal in event.literals for part in newer(events.token(json.loads(literal)))
        ]

    def done(job: Job) -> list[str]:
        return newer(events.end(job))

    yield from _framed(
        svc, record, follower, cancel_on_close, hold, lambda: newer(events.head()), run, done
    )


def _framed(
    svc: Services,
    record: StoredResponse,
    follower: JobFollower,
    cancel_on_close: bool,
    hold: Job | None,
    head: Callable[[], list[str]],
    run: Callable[[TokenRun], list[str]],
    done: Callable[[Job], list[str]],
) -> Iterator[str]:
    """One response stream's frame, whatever renders its events: the head, then one write per
    wake-up (keep-alives, ``run`` per token run, ``done`` at the end), a Redis outage as an
    error event, and at the end the held job left to its grace or the abandoned one canceled."""
    finished = left = False
    if hold is not None:
        stream_hold.attach(svc, [hold])
    try:
        first = head()
        if first:
            yield "".join(first)
        pace = stream_pace(svc)
        for group in follow_many([follower], svc.settings.web.keepalive_seconds, pace):
            parts: list[str] = []  # one write per wake-up, however many tokens it brought
            for _index, event in group:
                if isinstance(event, KeepAlive):
                    parts.append(": keep-alive\n\n")
                elif isinstance(event, Status):
                    parts.append(waiting_comment(event))
                elif isinstance(event, TokenRun):
                    parts += run(event)
                elif isinstance(event, Done):
                    finished = True
                    parts.append(timing_comment([event.job]))  # its hops: clients skip it
                    parts += done(event.job)
            if parts:
                yield "".join(parts)
    except redis.RedisError as exc:
        log.warning("response stream %s ended: redis unavailable: %s", record.id, exc)
        yield typed_event({"type": "error", **unavailable(f"Redis unavailable: {exc}").to_dict()})
    except GeneratorExit:  # the server closed the body early: the client went away
        left = True
        raise
    finally:
        _stream_ended(svc, record, hold, finished, left, cancel_on_close)


def _stream_ended(
    svc: Services,
    record: StoredResponse,
    hold: Job | None,
    finished: bool,
    left: bool,
    cancel_on_close: bool,
) -> None:
    """A stream's end: a held job is left to its grace, an abandoned one is canceled."""
    if hold is not None:
        try:
            stream_hold.detach(svc, [hold], [] if finished else [hold], left)
        except redis.RedisError as exc:
            log.warning("response stream %s: could not hold its job: %s", record.id, exc)
            left = False
    if cancel_on_close and not finished and not (hold is not None and left):
        cancel_quietly(svc, [(record.job_id, record.model)])


def _tail(svc: Services, record: StoredResponse, job: Job, after: int) -> list[str]:
    tokens = svc.store.tokens(job.id) if record.logprobs else None
    count = len(tokens) if tokens is not None else svc.responses.token_count(job.id)
    events = render.tail_events(record, job, count, tokens)
    return [typed_event(e) for e in events if e["sequence_number"] > after]
