"""``Idempotency-Key``: a retried POST returns what the first one created instead of creating again.

Semantics follow the IETF draft "The Idempotency-Key HTTP Header Field":

- the key is the client's (any string of 1-255 characters; anything else is a 400 naming the
  header), scoped to the caller's API key: another key's requests never see it;
- the first request's records and the key are written in one Redis script (``CREATE_ONCE``),
  so two POSTs with one key, concurrent or not, create once; the later one gets what the first
  created (its job, its completion, its batch), finished or still running;
- the key remembers a fingerprint of the request (route and body); the same key with another
  body is a 422 that says so, and creates nothing;
- the key lives as long as the jobs it names (``queued_ttl_seconds + result_ttl_seconds``) and,
  being in Redis with the jobs, survives what they survive (a restart with the append-only file
  of ``trickle up``'s Redis);
- a request that created nothing (bad input, 429, a broker outage) leaves no key: its retry is a
  new first request.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from flask import request

from trickle import keys
from web.admission.auth import current_tenant_digest
from web.common.errors import HttpError, invalid
from web.services import Services

IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_LENGTH = 255


@dataclass(frozen=True)
class IdempotencyKey:
    """A request's key: where it lives in Redis, its shard, and the request's fingerprint."""

    redis_key: str
    shard: int
    fingerprint: str


@dataclass
class Created:
    """What the first request with a key created: its job ids, and a batch's id."""

    fingerprint: str
    job_ids: list[str] = field(default_factory=list)
    batch_id: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str) -> Created:
        data = json.loads(raw)
        return cls(str(data["fingerprint"]), list(data["job_ids"]), str(data["batch_id"]))


def requested_key(payload: Any) -> IdempotencyKey | None:
    """The request's ``Idempotency-Key`` (None without one); ``payload`` (the parsed body, or
    the raw bytes) makes its fingerprint. A 400 naming the header for an empty or long one."""
    value = request.headers.get(IDEMPOTENCY_HEADER)
    if value is None:
        return None
    if not value.strip():
        raise invalid(IDEMPOTENCY_HEADER, f"{IDEMPOTENCY_HEADER} must not be empty")
    if len(value) > MAX_LENGTH:
        raise invalid(
            IDEMPOTENCY_HEADER, f"{IDEMPOTENCY_HEADER} must be at most {MAX_LENGTH} characters"
        )
    scope = current_tenant_digest()
    return IdempotencyKey(
        keys.idempotency(scope, value), keys.idempotency_shard(scope, value), _fingerprint(payload)
    )


def _fingerprint(payload: Any) -> str:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload, sort_keys=True).encode()
    return hashlib.sha256(request.path.encode() + b"\n" + raw).hexdigest()


def ttl_seconds(svc: Services) -> int:
    limits = svc.settings.limits
    return limits.queued_ttl_seconds + limits.result_ttl_seconds


def earlier(svc: Services, key: IdempotencyKey | None) -> Created | None:
    """What an earlier request with this key created (None: this is the first). A different
    request under the same key is a 422."""
    if key is None:
        return None
    raw = svc.redis.get(key.redis_key)
    return None if raw is None else matching(key, str(raw))


def matching(key: IdempotencyKey, raw: str) -> Created:
    """The earlier request's record, if it was the same request; else a 422 that says so."""
    created = Created.from_json(raw)
    if created.fingerprint != key.fingerprint:
        raise HttpError(
            422,
            "invalid_request_error",
            f"this {IDEMPOTENCY_HEADER} was already used with a different request (route or body); "
            "use a new key for a new request",
            IDEMPOTENCY_HEADER,
            code="idempotency_key_reused",
        )
    return created
