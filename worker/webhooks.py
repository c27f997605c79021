"""Job-completion webhooks: POST the job object to an allowlisted URL, signed, with retries.

Only hosts named in ``webhooks.allowed_hosts`` are ever contacted (checked when the job is
submitted and again when sending), redirects are not followed, and every request carries
``X-Trickle-Signature: sha256=<hex>``, an HMAC of "<timestamp>.<body>" with ``webhooks.secret``,
so a receiver can check it came from this deployment and is fresh.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import time
from typing import Any
from urllib.parse import urlsplit

from worker.config import WebhookSettings


class WebhookRejected(ValueError):
    """The URL is not one Trickle may call; the message says why."""


class WebhookFailed(RuntimeError):
    """The receiver did not take the delivery (network error or non-2xx): retry later."""


def check_webhook_url(url: str, settings: WebhookSettings) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookRejected("webhook_url must be an absolute http(s) URL")
    if parts.username or parts.password:
        raise WebhookRejected("webhook_url must not carry credentials")
    if parts.hostname.lower() not in {host.lower() for host in settings.allowed_hosts}:
        raise WebhookRejected(
            f"webhook_url host {parts.hostname!r} is not in webhooks.allowed_hosts"
        )
    return url


def signature(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def deliver(url: str, payload: dict[str, Any], settings: WebhookSettings) -> int:
    """One delivery attempt; returns the receiver's status or raises WebhookFailed."""
    check_webhook_url(url, settings)
    parts = urlsplit(url)
    body = json.dumps(payload).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "trickle-webhook/1",
        "X-Trickle-Event": "job.finished",
        "X-Trickle-Timestamp": timestamp,
        "X-Trickle-Signature": signature(settings.secret, timestamp, body),
    }
    connection_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_class(
        parts.hostname or "", parts.port, timeout=settings.timeout_seconds
    )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        connection.request("POST", path, body=body, headers=headers)
        status = connection.getresponse().status
    except OSError as exc:
        raise WebhookFailed(f"webhook to {parts.hostname} failed: {exc}") from exc
    finally:
        connection.close()
    if not 200 <= status < 300:
        raise WebhookFailed(f"webhook to {parts.hostname} answered {status}")
    return status
