"""Access follows the view a request reaches, never its path string: every route the router maps
to an operator view (``/metrics``, ``/scaling/<model>``, with or without a trailing slash, GET
or HEAD) wants the operator's key, and every view not marked open wants a key."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from trickle.config.sections import AuthSettings
from trickle.config.settings import Settings
from trickle.tenants import KeySettings
from web.admission.auth import view_access

API_KEY, METRICS_TOKEN, NAMED_KEY = "plain-key", "scrape-token", "carol-key"
OPERATOR_PATHS = ["/metrics", "/metrics/", "/scaling/demo", "/scaling/demo/"]
OPEN_ENDPOINTS = {
    "health.healthz",
    "health.readyz",
    "health.openapi",
    "page.index",
    "page.static_file",
}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def keyed_app(
    settings: Settings, make_app: Callable[[Settings], Flask], metrics_token: str = ""
) -> Flask:
    named = {"carol": KeySettings(name="carol", key=NAMED_KEY)}
    auth = AuthSettings(api_keys=(API_KEY,), metrics_token=metrics_token)
    return make_app(dataclasses.replace(settings, auth=auth, keys=named))


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    return keyed_app(settings, make_app)


@pytest.fixture(scope="module")
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.mark.parametrize("path", OPERATOR_PATHS)
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_operator_routes_want_a_plain_api_key_whatever_the_spelling(
    client: FlaskClient, path: str, method: str
) -> None:
    for headers in ({}, bearer("wrong"), bearer(NAMED_KEY)):
        response = client.open(path, method=method, headers=headers)
        assert response.status_code == 401, (path, method, headers)
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert client.open(path, method=method, headers=bearer(API_KEY)).status_code == 200


@pytest.mark.parametrize("path", OPERATOR_PATHS)
def test_with_a_metrics_token_only_that_token_opens_operator_routes(
    settings: Settings, make_app: Callable[[Settings], Flask], path: str
) -> None:
    client = keyed_app(settings, make_app, metrics_token=METRICS_TOKEN).test_client()
    for key in (API_KEY, NAMED_KEY):
        assert client.get(path, headers=bearer(key)).status_code == 401
    assert client.get(path, headers=bearer(METRICS_TOKEN)).status_code == 200
    # The metrics token is the operator's, not an API key.
    assert client.get("/v1/models", headers=bearer(METRICS_TOKEN)).status_code == 401


def test_a_metrics_token_alone_closes_operator_routes_and_leaves_the_api_open(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    client = make_app(
        dataclasses.replace(settings, auth=AuthSettings(metrics_token=METRICS_TOKEN))
    ).test_client()
    assert client.get("/scaling/demo/").status_code == 401
    assert client.head("/metrics/").status_code == 401
    assert client.get("/scaling/demo", headers=bearer(METRICS_TOKEN)).status_code == 200
    assert client.get("/v1/models").status_code == 200


def test_without_keys_operator_routes_stay_open(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    client = make_app(settings).test_client()
    assert client.get("/scaling/demo/").status_code == 200
    assert client.head("/metrics/").status_code == 200


def concrete_paths(app: Flask) -> Iterator[tuple[str, str, str]]:
    """(endpoint, method, path) for every rule, its arguments filled in, with and without a
    trailing slash."""
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", lambda match: f"x{match.group(1)}", rule.rule)
        for method in sorted((rule.methods or set()) - {"OPTIONS"}):
            for spelling in {path, path.rstrip("/") + "/"}:
                yield rule.endpoint, method, spelling


def test_every_route_not_marked_open_wants_a_key(app: Flask, client: FlaskClient) -> None:
    """A view nobody marked is an API view: the table of open views is the whole list."""
    marked = {endpoint: view_access(view) for endpoint, view in app.view_functions.items()}
    assert {endpoint for endpoint, access in marked.items() if access == "open"} == OPEN_ENDPOINTS
    assert {endpoint for endpoint, access in marked.items() if access == "operator"} == {
        "metrics.metrics",
        "scaling.scaling",
    }
    checked = 0
    for endpoint, method, path in concrete_paths(app):
        with client.open(path, method=method) as response:
            status = response.status_code
        if endpoint in OPEN_ENDPOINTS:
            assert status != 401, (method, path)
        else:
            assert status == 401, (method, path, status)
            checked += 1
    assert checked > 20
