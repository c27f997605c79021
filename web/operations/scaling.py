"""GET /scaling/<model>: what an external autoscaler (KEDA's metrics-api scaler, an HPA through
an external-metrics adapter) needs to size a model's worker pool, as one JSON object.

``demand_slots`` (running plus waiting jobs, every priority) over ``slots_per_worker`` is the
worker count; KEDA computes exactly that with ``valueLocation: demand_slots`` and
``targetValue`` set to ``slots_per_worker``. An operator view like /metrics
(``web.admission.auth``): with keys configured the scaler sends the metrics token (KEDA's
``authModes: bearer``).
"""

from __future__ import annotations

import time

from flask import Blueprint, Response, jsonify

from trickle.capacity import read_load, slots_per_worker
from web.admission.auth import operator_route
from web.common.errors import not_found
from web.services import services

blueprint = Blueprint("scaling", __name__)


@blueprint.get("/scaling/<model>")
@operator_route
def scaling(model: str) -> Response:
    svc = services()
    if model not in svc.settings.models:
        raise not_found(f"model {model!r} is not configured", "model", "model_not_found")
    ttl = svc.settings.worker.heartbeat_ttl_seconds
    load = read_load(svc.redis, model, ttl, time.time(), svc.queues)
    per_worker = slots_per_worker(svc.settings.model(model))
    return jsonify(
        {
            "model": model,
            "queue_depth": load.depth,
            "oldest_queued_seconds": round(load.oldest_queued_seconds, 3),
            "workers": len(load.workers),
            "busy_slots": load.busy,
            "total_slots": load.total,
            "slots_per_worker": per_worker,
            "demand_slots": load.demand,
            "desired_workers": load.workers_needed(per_worker),
        }
    )
