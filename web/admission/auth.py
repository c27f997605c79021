"""Optional API keys: with keys configured, every route wants ``Authorization: Bearer`` (or
``x-api-key``, as Anthropic's clients send it) unless its view says otherwise.

What a request may reach is decided by the view it is routed to, never by its path string: a
path the router maps to a view (``/metrics/``, ``HEAD /metrics``) gets that view's rule. Each
view is one of three kinds:

- ``open`` (``@open_route``): health probes, the OpenAPI document, the browser page;
- ``operator`` (``@operator_route``): deployment-wide views (``/metrics``, ``/scaling/<model>``).
  They take ``auth.metrics_token`` or, without one, a key of ``[auth] api_keys``; a named key
  (``[keys.<name>]``) never opens them, since they show every tenant's load and usage;
- ``api``, every view not marked (and any path that is not a route): an API key or a named key.

Keys are compared as SHA-256 digests in constant time, so a config may hold ``sha256:<hex>``
digests instead of the keys themselves.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Literal, TypeVar

from flask import Flask, current_app, g, request

from trickle.tenants import KeySettings, TenantTable, digest_of_entry, key_digest
from web.common.errors import HttpError

# Anthropic's clients send their key here instead of Authorization.
API_KEY_HEADER = "x-api-key"
# Matches no key: operator views with named keys but neither a metrics token nor api_keys.
NO_DIGEST = "-"

Access = Literal["open", "operator", "api"]
ACCESS_ATTRIBUTE = "trickle_access"
View = TypeVar("View", bound=Callable[..., object])


def open_route(view: View) -> View:
    """Mark a view as open to anyone, keys or not (probes, the page, the API's schema)."""
    setattr(view, ACCESS_ATTRIBUTE, "open")
    return view


def operator_route(view: View) -> View:
    """Mark a view as the operator's: the metrics token, else an ``[auth] api_keys`` key."""
    setattr(view, ACCESS_ATTRIBUTE, "operator")
    return view


def view_access(view: object) -> Access:
    """A view's kind; ``api`` for anything unmarked, so a view someone forgets to mark is
    closed rather than open."""
    access: Access = getattr(view, ACCESS_ATTRIBUTE, "api")
    return access


def route_access() -> Access:
    """The kind of the view this request is routed to (``api`` when no view serves it)."""
    return view_access(current_app.view_functions.get(request.endpoint or ""))


def accepted_digests(api_keys: tuple[str, ...]) -> frozenset[str]:
    return frozenset(digest_of_entry(entry) for entry in api_keys)


def unauthorized(message: str) -> HttpError:
    return HttpError(
        401,
        "invalid_request_error",
        message,
        headers={"WWW-Authenticate": "Bearer"},
        code="invalid_api_key",
    )


def current_tenant_digest() -> str:
    """The caller's key digest ("" when no API keys are configured): jobs belong to it."""
    return str(g.get("api_key_digest", ""))


def current_key() -> KeySettings | None:
    """The caller's tenant (a named key, or an ``[auth] api_keys`` entry's defaults), None for
    an anonymous caller (no keys configured)."""
    key: KeySettings | None = g.get("api_key")
    return key


def grant_stream_read(job_id: str) -> None:
    """A valid stream token for this job came with the request (see ``web.streams.access``)."""
    g.stream_token_job = job_id


def stream_grant() -> bool:
    """True when the request reads a job on the strength of its stream token, not a key."""
    return bool(g.get("stream_token_job"))


def install_auth(
    app: Flask, api_keys: tuple[str, ...], metrics_token: str = "", named: TenantTable | None = None
) -> None:
    """API views want an API key (``api_keys`` or a named key; ``named`` holds every tenant,
    both kinds); operator views want the metrics token when one is set, else a key of
    ``api_keys`` (deployment-wide counts are an operator's, a deliberate and documented choice);
    open views want nothing."""
    named = named or TenantTable({})
    digests = accepted_digests(api_keys) | frozenset(named.digests())
    # A named key never opens an operator view: every key's usage is no tenant's business.
    metrics_digests = (
        accepted_digests((metrics_token,)) if metrics_token else accepted_digests(api_keys)
    )
    if named and not metrics_digests:
        metrics_digests = frozenset({NO_DIGEST})
    if not digests and not metrics_digests:
        return

    @app.before_request
    def require_api_key() -> None:
        access = route_access()
        if access == "api" and digests:
            if stream_grant():
                return  # the token names the one job this request may read
            g.api_key_digest = digest = _bearer_digest(digests)
            g.api_key = named.by_digest(digest)
        elif access == "operator" and metrics_digests:
            _bearer_digest(metrics_digests)


def _bearer_digest(accepted: frozenset[str]) -> str:
    """The digest of the request's key, if it is one of ``accepted`` (else 401): its bearer
    token, or without an Authorization header its ``x-api-key`` (what Anthropic's clients
    send)."""
    authorization = request.headers.get("Authorization")
    if authorization is None and API_KEY_HEADER in request.headers:
        token = request.headers[API_KEY_HEADER]
    else:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            token = ""
    if not token.strip():
        raise unauthorized(f"missing API key: send Authorization: Bearer <key> or {API_KEY_HEADER}")
    digest = key_digest(token.strip())
    if not any(hmac.compare_digest(digest, known) for known in accepted):
        raise unauthorized("invalid API key")
    return digest
