"""docs/api.md and the served routes cannot drift apart: every route the guide names is served,
and every operation the OpenAPI document publishes is in the guide.

The guide names a route as ``METHOD /path`` with ``<name>`` for a path parameter; Flask's rules
and the OpenAPI document spell parameters ``<name>`` and ``{name}``. Each is compared with its
parameters' names erased, so the spelling of a parameter does not count, only the route.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask

from trickle.config.settings import Settings

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "api.md"
DOCUMENTED = re.compile(r"\b(GET|POST|DELETE|PUT|PATCH|HEAD) (/[A-Za-z0-9_/<>{}.-]*)")
PARAMETER = re.compile(r"<[^>]*>|\{[^}]*\}|job_<hex>")


def route(method: str, path: str) -> tuple[str, str]:
    return method.upper(), PARAMETER.sub("<>", path.rstrip("."))


def documented_routes() -> set[tuple[str, str]]:
    return {route(method, path) for method, path in DOCUMENTED.findall(GUIDE.read_text())}


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    return make_app(settings)


def test_every_documented_route_is_served(app: Flask) -> None:
    served = {
        route(method, rule.rule)
        for rule in app.url_map.iter_rules()
        for method in rule.methods or ()
    }
    documented = documented_routes()
    assert len(documented) > 20
    assert documented - served == set(), "docs/api.md names routes the app does not serve"


def test_every_published_operation_is_documented(app: Flask) -> None:
    document = app.test_client().get("/openapi.json").get_json()
    published = {
        route(method, path)
        for path, operations in document["paths"].items()
        for method in operations
        if method in {"get", "post", "delete", "put", "patch", "head"}
    }
    assert len(published) > 10
    assert published - documented_routes() == set(), "published operations missing in docs/api.md"
