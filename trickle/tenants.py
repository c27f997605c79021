"""Tenants: every accepted API key, who it is, what it may do, and its queues.

A named key's table (``[keys.<name>]``) holds the key (plain, or ``sha256:<hex>`` of it) and its
limits. A key of ``[auth] api_keys`` is a tenant too, with the defaults (``[rate_limits]``, no
caps, weight 1), named after its digest (``key-<12 hex>``, ``plain_tenant_name``) so that a team
setting two keys gets two fair shares without writing tables. A tenant's name, never its key, is
what logs, metrics and queue names carry. Without keys every caller is the unnamed tenant
(``DEFAULT_TENANT``): one queue per model, as a single-tenant service.

Part of the contract: the web tier (admission, rate limits) and the workers (queues, claims,
usage) read the same table; it imports nothing else of ``worker/``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

DIGEST_PREFIX = "sha256:"
# The tenant of anonymous callers and of ``[auth] api_keys``: the model's own queue.
DEFAULT_TENANT = ""
# What metrics call the default tenant (a label value cannot be empty and stay readable).
DEFAULT_TENANT_LABEL = "default"
# Priorities are 0 (interactive) and 9 (batch); see trickle.jobs.
MAX_PRIORITY_NUMBER = 9
# A weight is a number of queues in kombu's round robin (trickle/queue.py): keep it small.
MAX_WEIGHT = 16
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")
# A plain key's tenant: "key-" and its digest's first 12 hex digits (48 bits: two keys of a
# deployment share them by chance with odds of n^2 / 2^49, and a clash is refused at start).
PLAIN_PREFIX = "key-"
PLAIN_DIGITS = 12


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def digest_of_entry(entry: str) -> str:
    """The SHA-256 hex digest a configured key stands for (plain keys are hashed)."""
    if entry.startswith(DIGEST_PREFIX):
        return entry[len(DIGEST_PREFIX) :].lower()
    return key_digest(entry)


def plain_tenant_name(digest: str) -> str:
    """The tenant name of an ``[auth] api_keys`` entry: stable (from its digest, so a plain key
    and its ``sha256:`` form are one tenant) and never the key."""
    return PLAIN_PREFIX + digest[:PLAIN_DIGITS]


@dataclass(frozen=True)
class KeySettings:
    """One ``[keys.<name>]`` table. A rate left at None follows ``[rate_limits]``; 0 is none."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    name: str
    key: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt tokens + max_tokens, reserved at submission
    # Jobs of this key running at once, over every worker; past it a job waits queued. 0: no cap.
    max_running_jobs: int = 0
    # Jobs of this key waiting per model; past it a submission gets 429. 0: [limits] alone.
    max_queued_jobs: int = 0
    # Models this key may use; empty: every model.
    allowed_models: tuple[str, ...] = ()
    # The most urgent priority it may use: 0 any, 9 batch only (Trickle's 0-first scale).
    max_priority: int = 0
    # Its share of the slots against other keys with work at the same priority (equal: 1).
    weight: int = 1

    @property
    def digest(self) -> str:
        return digest_of_entry(self.key)


_KEY = TypeAdapter(KeySettings)


def build_keys(tables: Mapping[str, Mapping[str, Any]]) -> dict[str, KeySettings]:
    """``[keys.<name>]`` tables as KeySettings; a ValueError names the key path to fix."""
    built: dict[str, KeySettings] = {}
    for name, table in tables.items():
        if not _NAME.match(name):
            raise ValueError(
                f"keys.{name}: a key name is lower-case letters, digits, '-' and '_' "
                "(it names queues and metric labels)"
            )
        try:
            built[name] = _KEY.validate_python({**table, "name": name})
        except ValidationError as exc:
            problems = "; ".join(
                f"keys.{name}.{'.'.join(map(str, error['loc']))}: {error['msg']}"
                for error in exc.errors(include_url=False)
            )
            raise ValueError(problems) from None
    return built


def check_keys(
    keys: Mapping[str, KeySettings], models: Iterable[str], api_keys: Iterable[str]
) -> None:
    """Each problem names the key's table (never the key itself)."""
    known = set(models)
    seen = {digest_of_entry(entry): "auth.api_keys" for entry in api_keys}
    for name, spec in keys.items():
        where = f"keys.{name}"
        if not spec.key.strip():
            raise ValueError(f"{where}.key must be set (a plain key or sha256:<hex>)")
        if spec.key.startswith(DIGEST_PREFIX) and not _HEX_DIGEST.match(spec.digest):
            raise ValueError(f"{where}.key: sha256: must be followed by 64 hex digits")
        if spec.digest in seen:
            raise ValueError(f"{where}.key is the same key as {seen[spec.digest]}")
        seen[spec.digest] = where
        for field in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(spec, field)
            if value is not None and value < 0:
                raise ValueError(f"{where}.{field} must be >= 0")
        for field in ("max_running_jobs", "max_queued_jobs"):
            if getattr(spec, field) < 0:
                raise ValueError(f"{where}.{field} must be >= 0 (0: no cap)")
        for model in spec.allowed_models:
            if model not in known:
                raise ValueError(f"{where}.allowed_models names unknown model {model!r}")
        if not 0 <= spec.max_priority <= MAX_PRIORITY_NUMBER:
            raise ValueError(f"{where}.max_priority must be 0 (any) to 9 (batch only)")
        if not 1 <= spec.weight <= MAX_WEIGHT:
            raise ValueError(f"{where}.weight must be 1 to {MAX_WEIGHT}")


def every_tenant(
    named: Mapping[str, KeySettings], api_keys: Iterable[str]
) -> dict[str, KeySettings]:
    """Every accepted key as a tenant, by name: the named keys, then one per distinct
    ``api_keys`` entry (its table holds only its digest: the plain key stays out of it). A
    ValueError names the clash (two entries sharing a name, or a named key taking one)."""
    tenants = dict(named)
    for position, entry in enumerate(api_keys):
        digest = digest_of_entry(entry)
        name = plain_tenant_name(digest)
        found = tenants.get(name)
        if found is None:
            tenants[name] = KeySettings(name=name, key=DIGEST_PREFIX + digest)
        elif name in named:
            raise ValueError(
                f"keys.{name}: the name is that of auth.api_keys[{position}]'s tenant "
                f"({PLAIN_PREFIX}<first {PLAIN_DIGITS} hex of its sha256>); rename the table"
            )
        elif found.digest != digest:
            raise ValueError(
                f"auth.api_keys[{position}]: its digest starts like another entry's "
                f"({name}); replace one of the two keys"
            )
    return tenants


class TenantTable:
    """The tenants by digest, and each one's limits; built once per process."""

    def __init__(self, keys: Mapping[str, KeySettings]):
        self._by_name = dict(keys)
        self._by_digest = {spec.digest: spec for spec in keys.values()}

    def __bool__(self) -> bool:
        return bool(self._by_name)

    def names(self) -> list[str]:
        return list(self._by_name)

    def digests(self) -> list[str]:
        return list(self._by_digest)

    def by_digest(self, digest: str) -> KeySettings | None:
        return self._by_digest.get(digest)

    def __len__(self) -> int:
        return len(self._by_name)

    def name_of_digest(self, tenant_digest: str) -> str:
        """The tenant of a job's tenant (its key digest): its name, or the default one (no key)."""
        spec = self._by_digest.get(tenant_digest)
        return spec.name if spec else DEFAULT_TENANT

    def weight(self, name: str) -> int:
        spec = self._by_name.get(name)
        return spec.weight if spec else 1

    def max_running(self, name: str) -> int:
        spec = self._by_name.get(name)
        return spec.max_running_jobs if spec else 0


def tenant_label(name: str) -> str:
    return name or DEFAULT_TENANT_LABEL
