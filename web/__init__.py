"""Trickle web tier: ``create_app()`` builds the Flask app (``gunicorn 'web:create_app()'``)."""

from __future__ import annotations

import logging
import os

from flask import Flask

from trickle.config.settings import Settings, load_settings
from trickle.telemetry.tracing import Tracing
from web.admission.auth import install_auth
from web.common.arrival import install_arrival
from web.common.cors import install_cors
from web.common.errors import register_error_handlers
from web.common.unchecked_formats import install_unchecked_formats
from web.services import EXTENSION_KEY
from web.wiring import build_services


def create_app(settings: Settings | None = None) -> Flask:
    """App factory: tests pass settings; servers read the file and environment once here."""
    settings = settings or load_settings(environ=os.environ)
    logging.basicConfig(level=logging.INFO)
    # The page blueprint serves web/static itself (with no-cache headers).
    app = Flask(__name__, static_folder=None)
    # No redirects: a merged or added slash would be answered with a 308 (HTML, its Location
    # built from the Host header); a path that is not a route is a JSON 404 instead.
    app.url_map.merge_slashes = False
    app.url_map.strict_slashes = False
    app.config["MAX_CONTENT_LENGTH"] = settings.web.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions[EXTENSION_KEY] = svc = build_services(settings)
    svc.tracing = Tracing.from_environment(os.environ, "trickle-web")

    from web import page
    from web.anthropic import errors as anthropic_errors
    from web.anthropic import routes as anthropic_routes
    from web.batches import files
    from web.batches import routes as batches
    from web.jobs import routes as jobs
    from web.openai import routes as openai_routes
    from web.openai.responses_api import routes as responses_routes
    from web.operations import health, metrics, scaling
    from web.streams import access as stream_access
    from web.streams import routes as stream

    # Hook order matters: preflights are answered before any credential check, and a stream
    # token is checked before the API key it stands in for.
    install_cors(app, settings.web.cors_origins)
    install_arrival(app)  # first of all the hooks, whenever it is installed
    stream_access.install_stream_access(app)
    install_auth(app, settings.auth.api_keys, settings.auth.metrics_token, svc.tenants)
    app.register_blueprint(jobs.blueprint)
    app.register_blueprint(openai_routes.blueprint)
    app.register_blueprint(responses_routes.blueprint)
    app.register_blueprint(anthropic_routes.blueprint)
    app.register_blueprint(batches.blueprint)
    app.register_blueprint(files.blueprint)
    app.register_blueprint(health.blueprint)
    app.register_blueprint(metrics.blueprint)
    app.register_blueprint(scaling.blueprint)
    app.register_blueprint(page.blueprint)
    stream.register(app)
    register_error_handlers(app)
    anthropic_errors.install_error_shape(app)
    install_unchecked_formats(app)
    svc.rate_limiter.install(app)
    return app
