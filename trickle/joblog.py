"""Structured job logs: one JSON line per job event (claimed, resumed, finished, requeued...).

Operators grep or ship these; every line carries the job id, the model and the timings known at
that point, so one job's life can be followed across workers.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("trickle.jobs")


def log_job_event(event: str, job_id: str, model: str, **fields: Any) -> None:
    record: dict[str, Any] = {"event": event, "job_id": job_id, "model": model}
    record.update({k: round(v, 6) if isinstance(v, float) else v for k, v in fields.items()})
    log.info(json.dumps(record, sort_keys=False))
