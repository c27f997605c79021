"""The webhook address guard: every IPv6 form that carries an internal IPv4 address is internal,
and the name is resolved and checked in the connection's own connect step, so the address
connected to is the one checked (a name that rebinds after the submission check gains nothing).

Name resolution and the socket are replaced here (pure logic: no network in this tier).
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trickle.config.sections import WebhookSettings
from trickle.webhooks import (
    WebhookFailed,
    WebhookRejected,
    deliver,
    embedded_ipv4,
    is_public,
    resolve_address,
)

INTERNAL = [
    "127.0.0.1",
    "10.1.2.3",
    "169.254.169.254",
    "100.64.0.1",
    "0.0.0.0",
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "ff02::1",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:10.0.0.1",
    "64:ff9b::7f00:1",  # NAT64 well-known prefix: 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64: 169.254.169.254, the cloud metadata address
    "64:ff9b::c0a8:1",  # NAT64: 192.168.0.1
    "64:ff9b:1::7f00:1",  # local-use NAT64 (RFC 8215)
    "64:ff9b:1::808:808",
    "2002:7f00:1::1",  # 6to4: 127.0.0.1
    "2002:a00:1::1",  # 6to4: 10.0.0.1
    "::127.0.0.1",  # IPv4-compatible
    "::10.0.0.1",
    "::8.8.8.8",  # IPv4-compatible is deprecated: never a public endpoint
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
]
PUBLIC = ["8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"]
STRICT = WebhookSettings(allowed_hosts=("hooks.example",), allowed_ports=(8443,))


@pytest.mark.parametrize("text", INTERNAL)
def test_internal_addresses_and_their_ipv6_forms_are_not_public(text: str) -> None:
    assert not is_public(ipaddress.ip_address(text))


@pytest.mark.parametrize("text", PUBLIC)
def test_public_addresses_stay_public(text: str) -> None:
    assert is_public(ipaddress.ip_address(text))


def test_the_embedded_ipv4_of_each_form() -> None:
    loopback = ipaddress.IPv4Address("127.0.0.1")
    for text in ("::ffff:127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::1"):
        assert embedded_ipv4(ipaddress.IPv6Address(text)) == [loopback], text
    assert embedded_ipv4(ipaddress.IPv6Address("2606:4700::1111")) == []


def ipv6_forms(v4: ipaddress.IPv4Address) -> list[ipaddress.IPv6Address]:
    """Every way an IPv6 address can carry ``v4``."""
    value = int(v4)
    return [
        ipaddress.IPv6Address((0xFFFF << 32) | value),  # IPv4-mapped
        ipaddress.IPv6Address((0x64FF9B << 96) | value),  # NAT64
        ipaddress.IPv6Address((0x64FF9B0001 << 80) | value),  # local-use NAT64
        ipaddress.IPv6Address((0x2002 << 112) | (value << 80) | 1),  # 6to4
        ipaddress.IPv6Address(value),  # IPv4-compatible
    ]


INTERNAL_V4 = [
    ipaddress.IPv4Network(net)
    for net in ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
                "172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4")
]  # fmt: skip
IPV4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address) | st.sampled_from(INTERNAL_V4).flatmap(
    lambda net: st.integers(int(net[0]), int(net[-1])).map(ipaddress.IPv4Address)
)


@given(IPV4)
def test_no_ipv6_form_of_an_internal_ipv4_address_is_public(v4: ipaddress.IPv4Address) -> None:
    for form in ipv6_forms(v4):
        assert not is_public(form) or is_public(v4), (v4, form)


def resolving_to(monkeypatch: pytest.MonkeyPatch, *answers: list[str]) -> list[str]:
    """Make each getaddrinfo call answer the next list of addresses; returns the names asked."""
    asked: list[str] = []
    pending = list(answers)

    def getaddrinfo(host: str, port: int, *_: Any, **__: Any) -> list[Any]:
        asked.append(host)
        addresses = pending.pop(0) if len(pending) > 1 else pending[0]
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


@pytest.mark.parametrize("text", [t for t in INTERNAL if ":" in t])
def test_a_name_resolving_to_an_ipv6_form_of_an_internal_address_is_refused(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    resolving_to(monkeypatch, [text])
    with pytest.raises(WebhookRejected, match="internal address"):
        resolve_address("hooks.example", 8443, STRICT)


def test_the_first_public_answer_is_the_address_used(monkeypatch: pytest.MonkeyPatch) -> None:
    resolving_to(monkeypatch, ["64:ff9b::7f00:1", "2002:7f00:1::1", "2606:4700::1111"])
    assert resolve_address("hooks.example", 8443, STRICT) == "2606:4700::1111"
    resolving_to(monkeypatch, ["::ffff:8.8.8.8"])
    assert resolve_address("hooks.example", 8443, STRICT) == "8.8.8.8"


def connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Record each connect's address and fail it (no network here)."""
    made: list[tuple[str, int]] = []

    def create_connection(address: tuple[str, int], *_: Any, **__: Any) -> socket.socket:
        made.append(address)
        raise ConnectionRefusedError("no network in the unit tier")

    monkeypatch.setattr(socket, "create_connection", create_connection)
    return made


def test_delivery_connects_to_exactly_the_address_it_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = resolving_to(monkeypatch, ["8.8.8.8"])
    made = connections(monkeypatch)
    with pytest.raises(WebhookFailed):
        deliver("https://hooks.example:8443/h", {"id": "job"}, STRICT)
    assert asked == ["hooks.example"] and made == [("8.8.8.8", 8443)]


def test_a_name_that_rebinds_to_an_internal_address_is_refused_at_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first answer is public (as a check at submission would see), every later one is
    NAT64 loopback: the connect step resolves again and never connects."""
    resolving_to(monkeypatch, ["8.8.8.8"], ["64:ff9b::7f00:1"])
    made = connections(monkeypatch)
    assert resolve_address("hooks.example", 8443, STRICT) == "8.8.8.8"
    with pytest.raises(WebhookRejected, match="64:ff9b::7f00:1"):
        deliver("http://hooks.example:8443/h", {"id": "job"}, STRICT)
    assert made == []


def test_private_addresses_pass_only_when_the_operator_allows_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolving_to(monkeypatch, ["64:ff9b::7f00:1"])
    allowed = WebhookSettings(allowed_hosts=("hooks.example",), allow_private_addresses=True)
    assert resolve_address("hooks.example", 80, allowed) == "64:ff9b::7f00:1"
