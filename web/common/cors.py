"""CORS for the ``/v1`` routes, for the origins listed in ``web.cors_origins`` (none by default).

Written out rather than taken from flask-cors, which cannot express one rule Trickle keeps:
a list that mixes ``*`` with named origins gives the named ones credentials and everyone else a
bare ``*``. flask-cors's ``supports_credentials`` holds for a whole resource: with ``*`` among
the origins it either refuses the configuration (``send_wildcard``) or reflects every origin
with ``Access-Control-Allow-Credentials: true`` (checked against flask-cors 6.0's
``get_cors_origins``), which would let any site send a user's cookies. The policy is also a
few lines, and it answers preflights before the API key check, which a browser's preflight can
never pass (it carries no ``Authorization``).

A listed origin is echoed back with ``Access-Control-Allow-Credentials: true``; ``*`` answers
any origin with a literal ``*`` and never with credentials (browsers refuse the pair, and it
would let every site send a user's cookies). An origin not listed gets no CORS header at all.
An allowed origin also gets ``Timing-Allow-Origin`` (the same value) and may read
``Server-Timing``: the hops of its answers, in the header and in the page's Resource Timing.
"""

from __future__ import annotations

from flask import Flask, Response, request

CORS_PREFIX = "/v1/"
WILDCARD = "*"
ALLOWED_METHODS = "GET, POST, OPTIONS"
ALLOWED_HEADERS = (
    "Authorization, Content-Type, Last-Event-ID, Prefer, Accept, Idempotency-Key, "
    "Cancel-After, x-api-key, anthropic-version"
)
# Response headers a script may read besides the CORS-safelisted ones.
EXPOSED_HEADERS = (
    "Location, Retry-After, WWW-Authenticate, X-Batch-Status, Trickle-Wait-Interrupted, "
    "Server-Timing, Trickle-Unchecked-Formats"
)
PREFLIGHT_MAX_AGE_SECONDS = "600"


class CorsPolicy:
    def __init__(self, origins: tuple[str, ...]):
        self.any_origin = WILDCARD in origins
        self.origins = frozenset(origin for origin in origins if origin != WILDCARD)

    def allow_origin(self, origin: str | None) -> str | None:
        """The ``Access-Control-Allow-Origin`` value for this origin, or None (no CORS)."""
        if not origin:
            return None
        if origin in self.origins:
            return origin
        return WILDCARD if self.any_origin else None

    def headers(self, origin: str | None) -> dict[str, str]:
        allowed = self.allow_origin(origin)
        if allowed is None:
            return {}
        # Timing-Allow-Origin lets the page's Resource Timing read the hops (``serverTiming``),
        # which CORS alone leaves empty for another origin.
        headers = {"Access-Control-Allow-Origin": allowed, "Timing-Allow-Origin": allowed}
        if allowed != WILDCARD:
            headers["Access-Control-Allow-Credentials"] = "true"
        return headers


def install_cors(app: Flask, origins: tuple[str, ...]) -> None:
    """Register before any other ``before_request`` hook, so preflights skip the key check."""
    if not origins:
        return
    policy = CorsPolicy(origins)

    @app.before_request
    def answer_preflight() -> Response | None:
        if (
            request.method != "OPTIONS"
            or not request.path.startswith(CORS_PREFIX)
            or "Access-Control-Request-Method" not in request.headers
            or policy.allow_origin(request.headers.get("Origin")) is None
        ):
            return None
        response = Response(status=204)
        response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
        response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
        response.headers["Access-Control-Max-Age"] = PREFLIGHT_MAX_AGE_SECONDS
        return response  # the after_request hook below adds the origin headers

    @app.after_request
    def add_cors_headers(response: Response) -> Response:
        if request.path.startswith(CORS_PREFIX):
            # Caches must keep one answer per origin, also for the origins that got none.
            response.vary.add("Origin")
            headers = policy.headers(request.headers.get("Origin"))
            if headers:
                response.headers.update(headers)
                response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        return response
