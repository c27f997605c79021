"""What a named key may submit: its models, its most urgent priority, its backlog per model.

Checked at admission, before the rate limits count anything: a refused request costs its key
nothing. Each refusal names the ``[keys.<name>]`` field that refused it, never the key.
"""

from __future__ import annotations

from collections import Counter

from trickle.jobs import BATCH_PRIORITY, Job
from trickle.tenants import KeySettings
from web.common.errors import HttpError, too_many
from web.services import Services

KEY_QUEUE_FULL_RETRY_AFTER_SECONDS = 5


def forbidden(code: str, message: str, param: str) -> HttpError:
    return HttpError(403, "permission_error", message, param, code=code)


def check_key_policy(svc: Services, key: KeySettings | None, jobs: list[Job]) -> None:
    """403 for a model or priority the key may not use, 429 past its max_queued_jobs (per
    model and priority: interactive and batch jobs each have that many places)."""
    if key is None or not jobs:
        return
    per_model = Counter(job.model for job in jobs)
    if key.allowed_models:
        for model in per_model:
            if model not in key.allowed_models:
                raise forbidden(
                    "model_not_allowed",
                    f"key {key.name!r} may not use model {model!r} "
                    f"(keys.{key.name}.allowed_models: {', '.join(key.allowed_models)})",
                    "model",
                )
    most_urgent = min(job.priority for job in jobs)
    if most_urgent < key.max_priority:
        raise forbidden(
            "priority_not_allowed",
            f"key {key.name!r} may not submit at priority {most_urgent} "
            f"(keys.{key.name}.max_priority = {key.max_priority}: "
            f"{'batch only' if key.max_priority >= 9 else 'nothing more urgent'})",
            "priority",
        )
    if key.max_queued_jobs:
        # Per priority: the key's batch backlog does not close its own interactive queue.
        for (model, priority), adding in Counter((j.model, j.priority) for j in jobs).items():
            waiting = svc.queues.depth(model, key.name, priority)
            if waiting + adding > key.max_queued_jobs:
                kind = "batch" if priority >= BATCH_PRIORITY else "interactive"
                raise too_many(
                    "key_queue_full",
                    f"key {key.name!r} has {waiting} {kind} jobs waiting for model {model!r} "
                    f"(keys.{key.name}.max_queued_jobs = {key.max_queued_jobs}); retry later",
                    KEY_QUEUE_FULL_RETRY_AFTER_SECONDS,
                )
