"""The direct generation pusher sends the message Celery's send_task would, to the same list."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import redis

from worker import broker_transport, keys
from worker.capacity import message_job_id
from worker.config import DEFAULT_CONFIG_PATH, load_settings
from worker.jobs import BATCH_PRIORITY, GenerationParams, Job, new_job_id
from worker.queueing import enqueue_generation, generation_pusher, make_celery
from worker.store import JobStore

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


def test_redis_broker_channel_keeps_one_client_and_still_acks(
    private_redis: redis.Redis,
) -> None:
    """kombu built a redis.Redis per ack; the channel now keeps one per pool, and a message
    delivered and acked through it leaves nothing unacked."""
    port = private_redis.connection_pool.connection_kwargs["port"]
    url = f"redis://127.0.0.1:{port}/0"
    settings = load_settings(DEFAULT_CONFIG_PATH, environ={"TRICKLE_REDIS_URL": url})
    app = make_celery(settings, ["demo"])
    queue = keys.model_queue_list("demo", 0)
    private_redis.delete(queue, "unacked", "unacked_index")
    enqueue_generation(app, "job_ack", "demo")
    with app.connection_for_read() as connection:
        assert isinstance(connection.transport, broker_transport.Transport)
        channel = connection.channel()
        assert channel._create_client() is channel._create_client()
        first = channel._create_client()
        channel._disconnect_pools()  # what kombu does after a fork or a lost connection
        assert channel._create_client() is not first
        message = channel.basic_get(queue, no_ack=False)
        assert message is not None
        assert message.decode()[0] == ["job_ack"]  # protocol 2: (args, kwargs, embed)
        assert private_redis.hlen("unacked") == 1
        message.ack()
        assert private_redis.hlen("unacked") == 0
        channel.close()


def test_other_brokers_keep_kombus_transport(private_redis: redis.Redis) -> None:
    port = private_redis.connection_pool.connection_kwargs["port"]
    env = {"TRICKLE_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    rabbit = load_settings(
        DEFAULT_CONFIG_PATH, environ={**env, "TRICKLE_BROKER_URL": "amqp://guest@127.0.0.1//"}
    )
    assert not make_celery(rabbit, ["demo"]).conf.broker_transport


def test_record_and_message_travel_in_one_transaction(private_redis: redis.Redis) -> None:
    """Broker = the job store's Redis: the web tier writes the job and its task message in one
    MULTI (one round trip); a separate broker keeps the separate push."""
    port = private_redis.connection_pool.connection_kwargs["port"]
    url = f"redis://127.0.0.1:{port}/0"
    settings = load_settings(DEFAULT_CONFIG_PATH, environ={"TRICKLE_REDIS_URL": url})
    app = make_celery(settings, ["demo"])
    pusher = generation_pusher(settings, app, jobs_client=private_redis)
    assert pusher is not None and pusher.shares_store
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = Job(new_job_id(), "demo", "hi", GenerationParams(), created_at=time.time())
    queue = keys.model_queue_list("demo", 0)
    private_redis.delete(queue)
    commands: list[list[Any]] = []
    store.create(
        job,
        also=lambda pipe: (
            pusher.push_into(pipe, job.id, "demo"),
            commands.append(list(pipe.command_stack)),
        ),
    )
    assert private_redis.hget(keys.job(job.id), "status") == "queued"
    (raw,) = private_redis.lrange(queue, 0, -1)
    assert message_job_id(raw) == job.id
    # The push was queued on the job's own transaction, after the record's commands.
    (stack,) = commands
    assert stack[0][0][0] == "HSET" and stack[-1][0][0] == "LPUSH"
    elsewhere = load_settings(
        DEFAULT_CONFIG_PATH,
        environ={"TRICKLE_REDIS_URL": url, "TRICKLE_BROKER_URL": f"redis://127.0.0.1:{port}/1"},
    )
    separate = generation_pusher(elsewhere, make_celery(elsewhere, ["demo"]), private_redis)
    assert separate is not None and not separate.shares_store
