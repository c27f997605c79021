"""A job's URLs, and the read-only access their stream token grants.

Every job object carries ``urls``: ``self`` and ``cancel`` (they want the API key, as before),
``stream`` (SSE) and ``ws`` with a token for that job alone (see ``web.streams.tokens``). A
request with ``?token=`` on one of the read routes of that job is let through without an API
key; anywhere else the token grants nothing and the usual rules apply.

URLs are absolute, built from the request's own scheme and ``Host`` (the app trusts no
``X-Forwarded-*`` header: it has no proxy configuration to say which proxy to believe).
"""

from __future__ import annotations

import time

from flask import Flask, request

from web.admission.auth import grant_stream_read
from web.common.errors import HttpError
from web.common.response_models import JobObject, JobUrls, JobWithUrls
from web.services import services

TOKEN_PARAM = "token"
# The routes a stream token opens: the job's state, its SSE stream, its WebSocket.
READ_ENDPOINTS = frozenset({"jobs.get_job", "job_events", "job_ws"})


def install_stream_access(app: Flask) -> None:
    """Check ``?token=`` before the API key check (registered first, so it runs first)."""

    @app.before_request
    def check_stream_token() -> None:
        token = request.args.get(TOKEN_PARAM)
        if token is None or request.endpoint not in READ_ENDPOINTS:
            return
        job_id = str((request.view_args or {}).get("job_id", ""))
        if not services().stream_tokens().verify(job_id, token, time.time()):
            # One answer for tampered, expired and foreign tokens, and for ids that exist or not.
            raise HttpError(
                401,
                "invalid_request_error",
                "invalid or expired stream token: ask the job's owner for a fresh stream URL",
                param=TOKEN_PARAM,
                code="invalid_stream_token",
            )
        grant_stream_read(job_id)


def job_urls(job_id: str) -> JobUrls:
    """Absolute URLs of a job; the stream ones carry a fresh token valid for the result TTL."""
    svc = services()
    expires_at = int(time.time()) + svc.settings.limits.result_ttl_seconds
    token = svc.stream_tokens().issue(job_id, expires_at)
    # The Host header as sent (``host_url`` converted it to an IRI, werkzeug's URL walk, on
    # every response): an ASCII host, punycode included, is what a client connects to anyway.
    host = request.host
    base = f"{request.scheme}://{host}"
    ws_base = ("wss://" if request.scheme == "https" else "ws://") + host
    path = f"/v1/jobs/{job_id}"
    return {
        "self": f"{base}{path}",
        "cancel": f"{base}{path}/cancel",
        "stream": f"{base}{path}/events?{TOKEN_PARAM}={token}",
        "ws": f"{ws_base}{path}/ws?{TOKEN_PARAM}={token}",
    }


def with_urls(job_object: JobObject, job_id: str) -> JobWithUrls:
    described: JobWithUrls = {**job_object, "urls": job_urls(job_id)}
    return described
