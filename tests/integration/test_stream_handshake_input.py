"""No stream token and no WebSocket handshake gets a 5xx: in-process apps on the test Redis.

A token's expiry is ASCII digits only (``"²"`` passes ``str.isdigit()`` and fails ``int()``);
a WebSocket upgrade is checked before it happens, so a refused handshake is a JSON 4xx naming
the header, for a job that exists or not. Handshakes the checks let through are fuzzed against
a real gunicorn in ``tests/system/test_websocket_input.py`` (the upgrade needs its socket).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trickle.config.sections import AuthSettings
from trickle.config.settings import Settings

KEY = "handshake-key"
MISSING_JOB = "job_" + "0" * 32
NASTY_TOKENS = [
    "%C2%B2.x",  # "²": isdigit() but not int()
    "%D9%A3.x",  # Arabic-Indic three
    "%EF%BC%91.x",  # fullwidth one
    "%E2%85%A0.x",  # Roman numeral one
    "1" * 13 + ".x",
    "9" * 12 + "." + "A" * 43,
    ".",
    "..",
    "1.",
    "%00.%00",
    "%FF%FE.%80",
    "-1.x",
    "+1.x",
    "1_000.x",
    " 1.x",
    "1e9.x",
    "%ED%A0%80.x",  # a lone surrogate's UTF-8
]
GOOD_KEY = base64.b64encode(b"k" * 16).decode()
UPGRADE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13"}


@pytest.fixture(scope="module", params=["keys", "open"])
def client(
    request: pytest.FixtureRequest, settings: Settings, make_app: Callable[[Settings], Flask]
) -> FlaskClient:
    auth = AuthSettings((KEY,)) if request.param == "keys" else AuthSettings()
    return make_app(dataclasses.replace(settings, auth=auth)).test_client()


@pytest.fixture(scope="module")
def job_id(client: FlaskClient) -> str:
    response = client.post(
        "/v1/jobs",
        json={"prompt": "Hi", "model": "late"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 202, response.get_json()
    return str(response.get_json()["id"])


@pytest.mark.parametrize("token", NASTY_TOKENS)
@pytest.mark.parametrize("route", ["", "/events", "/ws"])
def test_a_nasty_stream_token_is_a_401(
    client: FlaskClient, job_id: str, token: str, route: str
) -> None:
    for job in (job_id, MISSING_JOB):
        headers = {**UPGRADE, "Sec-WebSocket-Key": GOOD_KEY} if route == "/ws" else {}
        response = client.get(f"/v1/jobs/{job}{route}?token={token}", headers=headers)
        assert response.status_code == 401, (job, route, token, response.get_data())
        assert response.get_json()["error"]["param"] == "token"


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(token=st.text(max_size=80), route=st.sampled_from(["", "/events", "/ws"]))
def test_no_stream_token_gets_a_5xx(
    client: FlaskClient, job_id: str, token: str, route: str
) -> None:
    headers = {**UPGRADE, "Sec-WebSocket-Key": GOOD_KEY} if route == "/ws" else {}
    response = client.get(
        f"/v1/jobs/{job_id}{route}", query_string={"token": token}, headers=headers
    )
    assert response.status_code < 500, (token, response.get_data())


HANDSHAKES: list[tuple[dict[str, str], str, int]] = [
    ({"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13"},
     "Sec-WebSocket-Key", 400),
    ({**UPGRADE, "Sec-WebSocket-Version": "8", "Sec-WebSocket-Key": GOOD_KEY},
     "Sec-WebSocket-Version", 426),
    ({"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": GOOD_KEY},
     "Sec-WebSocket-Version", 400),
    ({**UPGRADE, "Sec-WebSocket-Key": "not base64!"}, "Sec-WebSocket-Key", 400),
    ({**UPGRADE, "Sec-WebSocket-Key": base64.b64encode(b"short").decode()},
     "Sec-WebSocket-Key", 400),
    ({**UPGRADE, "Sec-WebSocket-Key": "\u00e9" * 24}, "Sec-WebSocket-Key", 400),
    ({**UPGRADE, "Sec-WebSocket-Version": "13, 8", "Sec-WebSocket-Key": GOOD_KEY},
     "Sec-WebSocket-Version", 426),
]  # fmt: skip


@pytest.mark.parametrize(("headers", "param", "status"), HANDSHAKES)
def test_a_refused_handshake_is_a_4xx_naming_the_header(
    client: FlaskClient, job_id: str, headers: dict[str, str], param: str, status: int
) -> None:
    for job in (job_id, MISSING_JOB):
        response = client.get(
            f"/v1/jobs/{job}/ws", headers={**headers, "Authorization": f"Bearer {KEY}"}
        )
        assert response.status_code == status, (job, headers, response.get_data())
        error = response.get_json()["error"]
        assert error["param"] == param and error["code"] == "invalid_websocket_handshake"
        if status == 426:
            assert response.headers["Sec-WebSocket-Version"] == "13"


def test_a_head_upgrade_is_a_4xx(client: FlaskClient) -> None:
    headers = {**UPGRADE, "Sec-WebSocket-Key": GOOD_KEY, "Authorization": f"Bearer {KEY}"}
    response = client.head(f"/v1/jobs/{MISSING_JOB}/ws", headers=headers)
    assert 400 <= response.status_code < 500


def test_a_plain_get_of_the_websocket_route_is_a_4xx(client: FlaskClient) -> None:
    response = client.get(f"/v1/jobs/{MISSING_JOB}/ws", headers={"Authorization": f"Bearer {KEY}"})
    assert 400 <= response.status_code < 500
    assert response.get_json()["error"]
