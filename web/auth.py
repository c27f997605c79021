"""Optional API keys: with keys configured, every /v1 route wants ``Authorization: Bearer``.

Keys are compared as SHA-256 digests in constant time, so a config may hold ``sha256:<hex>``
digests instead of the keys themselves. Health routes stay open for probes; ``/metrics`` takes
its own token (``auth.metrics_token``) or, without one, follows ``[auth] api_keys``; a named
key (``[keys.<name>]``) never opens it, since it shows every key's usage.
"""

from __future__ import annotations

import hmac

from flask import Flask, g, request

from trickle.tenants import DEFAULT_TENANT, KeySettings, TenantTable, digest_of_entry, key_digest
from web.errors import HttpError

PROTECTED_PREFIX = "/v1/"
METRICS_PATH = "/metrics"
# Matches no key: /metrics with named keys but neither a metrics token nor [auth] api_keys.
NO_DIGEST = "-"


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


def current_owner() -> str:
    """The caller's key digest ("" when no API keys are configured): jobs belong to it."""
    return str(g.get("api_key_digest", ""))


def current_key() -> KeySettings | None:
    """The caller's tenant (a named key, or an ``[auth] api_keys`` entry's defaults), None for
    an anonymous caller (no keys configured)."""
    key: KeySettings | None = g.get("api_key")
    return key


def current_tenant() -> str:
    """The caller's tenant: its key's name, or the default tenant."""
    key = current_key()
    return key.name if key else DEFAULT_TENANT


def grant_stream_read(job_id: str) -> None:
    """A valid stream token for this job came with the request (see ``web.stream_access``)."""
    g.stream_token_job = job_id


def stream_grant() -> bool:
    """True when the request reads a job on the strength of its stream token, not a key."""
    return bool(g.get("stream_token_job"))


def install_auth(
    app: Flask, api_keys: tuple[str, ...], metrics_token: str = "", named: TenantTable | None = None
) -> None:
    """/v1 wants an API key (``api_keys`` or a named key; ``named`` holds every tenant, both
    kinds); /metrics wants the metrics token when one is set, else a key of ``api_keys``
    (deployment-wide counts are an operator's, a deliberate and documented choice)."""
    named = named or TenantTable({})
    digests = accepted_digests(api_keys) | frozenset(named.digests())
    # A named key never opens /metrics: it holds every key's usage, no tenant's business.
    metrics_digests = (
        accepted_digests((metrics_token,)) if metrics_token else accepted_digests(api_keys)
    )
    if named and not metrics_digests:
        metrics_digests = frozenset({NO_DIGEST})
    if not digests and not metrics_digests:
        return

    @app.before_request
    def require_api_key() -> None:
        if request.path.startswith(PROTECTED_PREFIX) and digests:
            if stream_grant():
                return  # the token names the one job this request may read
            g.api_key_digest = digest = _bearer_digest(digests)
            g.api_key = named.by_digest(digest)
        elif request.path == METRICS_PATH and metrics_digests:
            _bearer_digest(metrics_digests)


def _bearer_digest(accepted: frozenset[str]) -> str:
    """The digest of the request's bearer token, if it is one of ``accepted`` (else 401)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("missing API key: send Authorization: Bearer <key>")
    digest = key_digest(token.strip())
    if not any(hmac.compare_digest(digest, known) for known in accepted):
        raise unauthorized("invalid API key")
    return digest
