"""Celery on RabbitMQ: durable quorum queues, with batch work queued apart from interactive work.

With ``broker.url = "amqp://…"`` the job queue moves to RabbitMQ while Redis keeps job state,
replay logs and the token plane. Every queue is a quorum queue (replicated, durable, with a
delivery limit so a message that keeps killing its consumers is eventually dropped).

Quorum queues have no message priorities before RabbitMQ 4.0 (Debian 12 ships 3.10), so the
Redis transport's priority steps cannot carry over. Instead each model has two queues:
``trickle.<model>`` for interactive jobs, which Celery consumes as usual, and
``trickle.<model>.batch`` for batch jobs, which Celery does not consume at all: a worker's
``BatchFeeder`` takes one message at a time from it, and only while the worker has a free slot
that no interactive job holds (see worker/batch_feeder.py). An interactive job is therefore
never stuck behind batch messages a worker prefetched.

Queue depth (the 429 bound, /metrics, /scaling, the autoscaler) is RabbitMQ's own count of
ready messages, read with a queue declaration; the oldest waiting job comes from Redis's
``trickle:queued`` index, since RabbitMQ cannot peek at a queue's head. Part of the contract:
no engine import, the web tier uses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis
from celery import Celery
from kombu import Exchange, Queue

from worker import keys

AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
# How many of the oldest queued jobs (all models) to look through for a model's oldest one.
OLDEST_SCAN = 256


def is_amqp(url: str) -> bool:
    return url.partition("://")[0] in AMQP_SCHEMES


def quorum_queue(name: str, delivery_limit: int) -> Queue:
    """A durable quorum queue bound to Trickle's topic exchange by its own name."""
    exchange = Exchange(keys.AMQP_EXCHANGE, type="topic", durable=True)
    return Queue(
        name,
        exchange,
        routing_key=name,
        durable=True,
        queue_arguments={"x-queue-type": "quorum", "x-delivery-limit": delivery_limit},
    )


def amqp_queues(models: Iterable[str], delivery_limit: int) -> list[Queue]:
    """Every queue a Celery app on RabbitMQ knows: per model interactive and batch, webhooks."""
    names = [keys.WEBHOOK_QUEUE]
    for model in models:
        names += [keys.model_queue(model), keys.model_batch_queue(model)]
    return [quorum_queue(name, delivery_limit) for name in names]


def amqp_conf() -> dict[str, Any]:
    """The Celery settings that differ on RabbitMQ from the Redis transport's."""
    return {
        # Quorum queues refuse global QoS: Celery then sets prefetch per consumer instead, and
        # routes countdown retries (webhooks) through its native delayed-delivery exchanges.
        "worker_detect_quorum_queues": True,
        # A job is accepted (202) only once RabbitMQ has confirmed its message.
        "broker_transport_options": {"confirm_publish": True},
        "task_default_exchange": keys.AMQP_EXCHANGE,
        "task_default_exchange_type": "topic",
    }


def consume_interactive_only(app: Celery, models: Iterable[str]) -> None:
    """Let Celery consume every queue but the batch ones, which the BatchFeeder takes from."""
    app.amqp.queues.select([keys.WEBHOOK_QUEUE] + [keys.model_queue(m) for m in models])


def declare_queues(app: Celery) -> None:
    """Declare every queue the app knows, batch ones included, before Celery's consumer starts:
    Celery declares only the queues it consumes, and binds all of them to its delayed-delivery
    exchanges (webhook retries), which fails for a queue that does not exist yet."""
    with app.connection_for_write() as conn:
        conn.ensure_connection()
        channel = conn.channel()
        for known in app.amqp.queues.values():
            known.bind(channel).declare()
        channel.close()


def batch_queue_of(app: Celery, model: str) -> str | None:
    """The model's batch queue if this app declares one (RabbitMQ), else None (Redis)."""
    name = keys.model_batch_queue(model)
    return name if name in app.amqp.queues else None


class AmqpQueueReader:
    """Queue depth from RabbitMQ, oldest waiting job from Redis."""

    def __init__(self, app: Celery, client: redis.Redis):
        self._app = app
        self._redis = client

    def depth(self, model: str) -> int:
        """Ready messages in the model's interactive and batch queues (prefetched ones, like
        kombu's unacked messages on Redis, are not waiting for a worker any more)."""
        names = [keys.model_queue(model), keys.model_batch_queue(model)]
        total = 0
        with self._app.pool.acquire(block=True) as conn:
            conn.ensure_connection(max_retries=1)
            channel = conn.default_channel
            for name in names:
                # Declaring with the same arguments is idempotent and answers the count; a
                # passive declaration would close the channel for a queue nobody declared yet.
                declared = self._app.amqp.queues[name].bind(channel).queue_declare()
                total += int(declared.message_count)
        return total

    def oldest_queued_seconds(self, model: str, now: float) -> float:
        """Age of the model's oldest queued job, from Redis's queued index (by deadline)."""
        entries = self._redis.zrange(keys.QUEUED_JOBS, 0, OLDEST_SCAN - 1)
        if not entries:
            return 0.0
        pipe = self._redis.pipeline(transaction=False)
        for job_id in entries:
            pipe.hmget(keys.job(str(job_id)), ["model", "created_at"])
        for found_model, created in pipe.execute():
            if found_model == model and created is not None:
                return max(now - float(created), 0.0)
        return 0.0
