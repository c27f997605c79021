"""Read-only stream tokens: what lets a browser open one job's stream without the API key.

A backend submits with its key and hands the browser ``urls.stream`` (or ``urls.ws``); the
browser's ``EventSource`` cannot send an ``Authorization`` header, so the URL carries a token
instead. A token is ``<expiry>.<signature>``: HMAC-SHA256 over the job id and the expiry (unix
seconds), keyed by the stream secret. It names one job and grants reading it, nothing more.
Checking it reads no job from Redis, so a bad token says nothing about whether the job exists.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

import redis

from trickle import keys

# Longest expiry accepted (digits): bounds the work a forged token can ask for.
MAX_EXPIRY_DIGITS = 12
# ASCII digits only: str.isdigit() and int() also take "²" or "٣", which int() then refuses or
# reads as another number than the one signed.
EXPIRY = re.compile(rf"[0-9]{{1,{MAX_EXPIRY_DIGITS}}}")


class StreamTokens:
    """Signs and checks tokens with one secret (the same in every web process)."""

    def __init__(self, secret: bytes):
        self._secret = secret

    def issue(self, job_id: str, expires_at: int) -> str:
        return f"{expires_at}.{self._signature(job_id, expires_at)}"

    def verify(self, job_id: str, token: str, now: float) -> bool:
        """True for a token issued for this job that has not expired; False for anything else
        (tampered, expired, another job's, not a token at all)."""
        expiry, dot, signature = token.partition(".")
        if not dot or EXPIRY.fullmatch(expiry) is None:
            return False
        expected = self._signature(job_id, int(expiry))
        # Compare even when expired, so timing tells nothing about which check failed.
        valid = hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace"))
        return valid and int(expiry) > now

    def _signature(self, job_id: str, expires_at: int) -> str:
        message = f"{job_id}\n{expires_at}".encode()
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def load_secret(client: redis.Redis, configured: str) -> bytes:
    """The configured secret, or the shared generated one: the first web process to need it
    creates it (SET NX, so two racing processes still agree), every other one reads it."""
    if configured:
        return configured.encode("utf-8")
    client.set(keys.STREAM_SECRET, secrets.token_hex(32), nx=True)
    return str(client.get(keys.STREAM_SECRET)).encode("ascii")
