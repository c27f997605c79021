"""Job-completion webhooks: POST the job object to an allowlisted URL, signed, with retries.

Only hosts named in ``webhooks.allowed_hosts`` are ever contacted (checked when the job is
submitted and again when sending), and only at a public address unless
``webhooks.allow_private_addresses`` says otherwise: the name is resolved when the connection
is made, inside the connection's own connect step, and the address checked is the one
connected to. An IPv6 address that carries an IPv4 one (IPv4-mapped, NAT64, 6to4, Teredo) is
judged by that IPv4 address too; redirects are not followed, and every request carries
``X-Trickle-Signature: sha256=<hex>``, an HMAC of "<timestamp>.<body>" with ``webhooks.secret``,
so a receiver can check it came from this deployment and is fresh.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import http.client
import ipaddress
import json
import socket
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from trickle.config.sections import WebhookSettings
from trickle.joblog import log_job_event
from trickle.store.job_store import JobStore

DEFAULT_PORTS = {"http": 80, "https": 443}
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# NAT64's well-known prefix (RFC 6052): a gateway connects to the IPv4 address in the low 32
# bits, so 64:ff9b::7f00:1 reaches 127.0.0.1 on the gateway's side.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# Never a public endpoint: local-use NAT64 (RFC 8215, an operator's own translation, embedding
# anywhere in the address) and IPv4-compatible addresses (RFC 4291, deprecated; ::127.0.0.1).
NEVER_PUBLIC = (ipaddress.IPv6Network("64:ff9b:1::/48"), ipaddress.IPv6Network("::/96"))


class WebhookRejected(ValueError):
    """The URL is not one Trickle may call; the message says why."""


class WebhookFailed(RuntimeError):
    """The receiver did not take the delivery (network error or non-2xx): retry later."""


def check_webhook_url(url: str, settings: WebhookSettings) -> str:
    """The URL if Trickle may call it (by its text: host allowlist, port, no credentials);
    the address it resolves to is checked at each delivery (``resolve_address``)."""
    if not (url.isascii() and url.isprintable()) or " " in url:
        raise WebhookRejected(
            "webhook_url must be printable ASCII without spaces or control characters "
            "(percent-encode anything else)"
        )
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for ":abc" or ":99999"
    except ValueError as exc:
        raise WebhookRejected(f"webhook_url is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookRejected("webhook_url must be an absolute http(s) URL")
    if parts.username or parts.password:
        raise WebhookRejected("webhook_url must not carry credentials")
    if parts.hostname.lower() not in {host.lower() for host in settings.allowed_hosts}:
        raise WebhookRejected(
            f"webhook_url host {parts.hostname!r} is not in webhooks.allowed_hosts"
        )
    if port == 0:
        raise WebhookRejected("webhook_url port must be between 1 and 65535")
    effective_port = port or DEFAULT_PORTS[parts.scheme]
    if settings.allowed_ports and effective_port not in settings.allowed_ports:
        raise WebhookRejected(f"webhook_url port {effective_port} is not in webhooks.allowed_ports")
    return url


def resolve_address(host: str, port: int, settings: WebhookSettings) -> str:
    """The address to connect to: an allowed name must not lead to an internal address
    (loopback, private, link-local, multicast, reserved, or an IPv6 form of one) unless the
    operator allows it.

    The delivery calls this from the connection's connect step and connects to exactly the
    address returned, so a name that changes what it resolves to between check and connect
    (DNS rebinding) gains nothing.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise WebhookFailed(f"webhook host {host} does not resolve: {exc}") from exc
    refused = ""
    for info in infos:
        address = _address(str(info[4][0]))
        if settings.allow_private_addresses or is_public(address):
            return str(address)
        refused = refused or str(address)
    raise WebhookRejected(
        f"webhook host {host} resolves to {refused}, an internal address "
        "(set webhooks.allow_private_addresses to allow it)"
    )


def _address(text: str) -> IPAddress:
    address = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:127.0.0.1 is loopback, and connects as IPv4
    return address


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, which some translator or tunnel reaches."""
    found = [v4 for v4 in (address.ipv4_mapped, address.sixtofour) if v4 is not None]
    if address.teredo is not None:
        found.extend(address.teredo)  # (server, client)
    if address in NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF))
    return found


def is_public(address: IPAddress) -> bool:
    """A globally reachable unicast address that leads to no internal IPv4 one."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return is_public(address.ipv4_mapped)  # it is that IPv4 address
        if any(address in network for network in NEVER_PUBLIC):
            return False
        if not all(is_public(v4) for v4 in embedded_ipv4(address)):
            return False
    return address.is_global and not address.is_multicast


def signature(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def _checked_connection(
    settings: WebhookSettings, target: tuple[str, int], timeout: Any = None, source: Any = None
) -> socket.socket:
    """http.client's connect step: resolve the name now, check the address, connect to it
    (Host, SNI and the certificate still use the name)."""
    host, port = target
    address = resolve_address(host, port, settings)
    return socket.create_connection((address, port), timeout, source)


def deliver(url: str, payload: Mapping[str, Any], settings: WebhookSettings) -> int:
    """One delivery attempt; returns the receiver's status, raises WebhookFailed (retry) or
    WebhookRejected (never: the URL or its address is not one Trickle may call)."""
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
    host = parts.hostname or ""
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    connection = connection_class(host, port, timeout=settings.timeout_seconds)
    connection._create_connection = functools.partial(_checked_connection, settings)  # type: ignore[attr-defined]
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        connection.request("POST", path, body=body, headers=headers)
        status = connection.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        raise WebhookFailed(f"webhook to {parts.hostname} failed: {exc}") from exc
    finally:
        connection.close()
    if not 200 <= status < 300:
        raise WebhookFailed(f"webhook to {parts.hostname} answered {status}")
    return status


def deliver_job(store: JobStore, job_id: str, settings: WebhookSettings) -> None:
    """Deliver a finished job to its webhook (a no-op once it has expired or has none)."""
    job = store.get(job_id)
    if job is None or not job.webhook_url:
        return
    deliver(job.webhook_url, job.to_dict(), settings)
    log_job_event("webhook_delivered", job.id, job.model, url=job.webhook_url)
