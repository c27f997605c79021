"""Liveness, readiness and the OpenAPI document."""

from __future__ import annotations

import time

import redis
from flask import Blueprint, Response, jsonify

from trickle import keys
from trickle.capacity import live_workers
from web.admission.auth import open_route
from web.api_schema import openapi_document
from web.services import services

blueprint = Blueprint("health", __name__)


@blueprint.get("/healthz")
@blueprint.get("/health")  # vLLM's and TGI's name, which load tools (GuideLLM) probe first
@open_route
def healthz() -> Response:
    """The process answers; says nothing about Redis or workers."""
    return jsonify({"status": "ok"})


@blueprint.get("/readyz")
@open_route
def readyz() -> Response:
    """Ready when Redis answers and a live worker consumes the default model's queue, or when
    an autoscaler will start one for the first job (zero workers is then a ready state)."""
    svc = services()
    model = svc.settings.default_model
    try:
        svc.redis.ping()
        ttl = svc.settings.worker.heartbeat_ttl_seconds
        workers = live_workers(svc.redis, model, ttl, time.time())
        scaled = svc.settings.autoscale.external_scaler or bool(svc.redis.exists(keys.AUTOSCALER))
    except redis.RedisError as exc:
        return _not_ready(f"redis unavailable: {exc}")
    if workers == 0 and not scaled:
        return _not_ready(f"no live worker serves the default model {model!r}")
    body = {"status": "ready", "default_model": model, "workers": workers, "autoscaled": scaled}
    return jsonify(body)


def _not_ready(reason: str) -> Response:
    response = jsonify({"status": "unavailable", "reason": reason})
    response.status_code = 503
    response.headers["Retry-After"] = "2"
    return response


@blueprint.get("/openapi.json")
@open_route
def openapi() -> Response:
    svc = services()
    return jsonify(openapi_document(svc.settings, svc.requests))
