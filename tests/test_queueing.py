"""The direct generation pusher sends the message Celery's send_task would, to the same list."""

from __future__ import annotations

import base64
import json
from typing import Any

import redis

from worker import keys
from worker.config import DEFAULT_CONFIG_PATH, load_settings
from worker.jobs import BATCH_PRIORITY
from worker.queueing import enqueue_generation, generation_pusher, make_celery

# Fields that differ between any two sends: fresh ids, and the sending process.
PER_SEND = {"id", "root_id", "origin", "correlation_id", "delivery_tag", "reply_to"}


def _without_per_send(message: dict[str, Any]) -> dict[str, Any]:
    return {
        **{k: v for k, v in message.items() if k not in ("headers", "properties", "body")},
        "headers": {k: v for k, v in message["headers"].items() if k not in PER_SEND},
        "properties": {k: v for k, v in message["properties"].items() if k not in PER_SEND},
        "body": json.loads(base64.b64decode(message["body"])),
    }


def test_pushed_message_is_the_one_send_task_builds(private_redis: redis.Redis) -> None:
    port = private_redis.connection_pool.connection_kwargs["port"]
    url = f"redis://127.0.0.1:{port}/0"
    settings = load_settings(DEFAULT_CONFIG_PATH, environ={"TRICKLE_REDIS_URL": url})
    app = make_celery(settings, ["demo"])
    pusher = generation_pusher(settings, app)
    assert pusher is not None
    for priority in (0, BATCH_PRIORITY):
        queue = keys.model_queue_list("demo", priority)
        private_redis.delete(queue)
        enqueue_generation(app, "job_0123", "demo", priority)
        pusher.push("job_0123", "demo", priority)
        pushed, sent = (json.loads(raw) for raw in private_redis.lrange(queue, 0, -1))
        assert _without_per_send(pushed) == _without_per_send(sent)
        assert pushed["headers"]["id"] == pushed["headers"]["root_id"]
        assert pushed["properties"]["correlation_id"] == pushed["headers"]["id"]
        assert set(pushed["headers"]) == set(sent["headers"])
        assert set(pushed["properties"]) == set(sent["properties"])


def test_no_pusher_where_celery_must_send(private_redis: redis.Redis) -> None:
    port = private_redis.connection_pool.connection_kwargs["port"]
    env = {"TRICKLE_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    with_events = load_settings(
        DEFAULT_CONFIG_PATH, environ={**env, "TRICKLE__WORKER__TASK_EVENTS": "true"}
    )
    assert generation_pusher(with_events, make_celery(with_events, ["demo"])) is None
    rabbit = load_settings(
        DEFAULT_CONFIG_PATH, environ={**env, "TRICKLE_BROKER_URL": "amqp://guest@127.0.0.1//"}
    )
    assert generation_pusher(rabbit, make_celery(rabbit, ["demo"])) is None
