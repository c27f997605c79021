"""The browser page: ``GET /`` and its assets, shipped with the package (no CDN, no build step).

The page talks only to the public API (``/v1/...``), so it needs no server-side state. Every
response says ``Cache-Control: no-cache``: browsers revalidate (cheap, ETag) instead of running
a stale script against a newer API after an upgrade.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response, send_from_directory

from web.admission.auth import open_route

STATIC_DIR = Path(__file__).resolve().parent / "static"

blueprint = Blueprint("page", __name__)


def _no_cache(response: Response) -> Response:
    response.headers["Cache-Control"] = "no-cache"
    return response


@blueprint.get("/")
@open_route
def index() -> Response:
    return _no_cache(send_from_directory(STATIC_DIR, "index.html"))


@blueprint.get("/static/<path:filename>")
@open_route
def static_file(filename: str) -> Response:
    # send_from_directory refuses paths that leave STATIC_DIR (404), so "../" cannot escape.
    return _no_cache(send_from_directory(STATIC_DIR, filename))
