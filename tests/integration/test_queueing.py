"""The one producer: every generation job is a Celery task, with Celery's own priorities.

Real Celery apps on a Redis of the module's own (the Redis transport as kombu ships it: no
message is built by hand and no test reads kombu's key layout), and RabbitMQ's declarations
without a broker (the stack on a real node is tests/system/test_rabbitmq.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import kombu
import redis
from celery import Celery
from flask import Flask

from ops.redis_server import free_port
from trickle import keys
from trickle.config.sections import BrokerSettings, RedisSettings
from trickle.config.settings import Settings
from trickle.jobs import BATCH_PRIORITY, INTERACTIVE_PRIORITY, Job, new_job_id
from trickle.params import GenerationParams
from trickle.queue import (
    QueueReader,
    broker_priority,
    enqueue_generation,
    is_amqp,
    make_celery,
    tenant_queues,
)
from trickle.store.job_store import JobStore
from trickle.tenants import build_keys
from web.admission.depth import AdmissionDepth


def on_private_redis(settings: Settings, client: redis.Redis) -> Settings:
    port = client.connection_pool.connection_kwargs["port"]
    return dataclasses.replace(settings, redis=RedisSettings(url=f"redis://127.0.0.1:{port}/0"))


def on_rabbitmq(settings: Settings) -> Settings:
    return dataclasses.replace(settings, broker=BrokerSettings(url="amqp://guest@mq//"))


def test_interactive_jobs_are_fetched_before_batch_ones_on_redis(
    settings: Settings, private_redis: redis.Redis
) -> None:
    """kombu's priority steps, read by a plain kombu consumer: the batch job was sent first,
    the interactive one is fetched first; the depth counts both."""
    private_redis.flushdb()
    app = make_celery(on_private_redis(settings, private_redis), ["demo"])
    enqueue_generation(app, "job_batch", "demo", BATCH_PRIORITY)
    enqueue_generation(app, "job_interactive", "demo", INTERACTIVE_PRIORITY)
    store = JobStore(private_redis, 60, 60)
    assert QueueReader(app, store).depth("demo") == 2
    fetched = []
    with app.connection_for_read() as conn:
        channel = conn.channel()
        for _ in range(2):
            message = channel.basic_get(keys.model_queue("demo"), no_ack=True)
            assert message is not None and message.headers["task"] == keys.GENERATE_TASK
            fetched.append(message.decode()[0][0])  # protocol 2: (args, kwargs, embed)
        channel.close()
    assert fetched == ["job_interactive", "job_batch"]
    assert QueueReader(app, store).depth("demo") == 0


def test_rabbitmq_queues_are_durable_priority_queues(settings: Settings) -> None:
    app = make_celery(on_rabbitmq(settings), ["demo"])
    queues = app.amqp.queues
    assert set(queues) == {keys.model_queue("demo"), keys.WEBHOOK_QUEUE}
    for queue in queues.values():
        assert queue.durable and not queue.auto_delete
        assert queue.max_priority == BATCH_PRIORITY  # x-max-priority
        assert (queue.exchange.name, queue.exchange.type) == (keys.AMQP_EXCHANGE, "topic")
        assert queue.routing_key == queue.name
    assert app.conf.worker_prefetch_multiplier == 1 and app.conf.task_acks_late
    assert app.conf.broker_transport_options == {"confirm_publish": True}
    assert is_amqp(app.conf.broker_url) and not is_amqp(settings.broker_url)


def test_priority_is_sent_the_way_each_broker_reads_it(settings: Settings) -> None:
    """Redis pops lower numbers first, RabbitMQ serves higher ones first."""
    on_redis = make_celery(settings, ["demo"])
    priorities = (INTERACTIVE_PRIORITY, BATCH_PRIORITY)
    assert [broker_priority(on_redis, p) for p in priorities] == [0, 9]
    rabbit = make_celery(on_rabbitmq(settings), ["demo"])
    assert [broker_priority(rabbit, p) for p in priorities] == [9, 0]


def test_a_failed_publish_takes_the_record_back_and_answers_503(
    settings: Settings, private_redis: redis.Redis, make_app: Callable[[Settings], Flask]
) -> None:
    """The broker is down: the job's record, written first, is deleted again, and the 503 says
    that nothing was created (a record is never left without its task)."""
    private_redis.flushdb()
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    broken = dataclasses.replace(
        on_private_redis(settings, private_redis), broker=BrokerSettings(url=down)
    )
    app = make_app(broken)
    # The 429 bound reads the broker too: count an empty queue without it.
    app.extensions["trickle"].admission_depth = AdmissionDepth(lambda model: 0)
    started = time.monotonic()
    response = app.test_client().post("/v1/jobs", json={"prompt": "The", "max_tokens": 1})
    assert response.status_code == 503, response.get_data(as_text=True)
    assert "no job was created" in response.get_json()["error"]["message"]
    assert int(response.headers["Retry-After"]) > 0
    assert time.monotonic() - started < 30
    assert not [k for k in private_redis.scan_iter(match="trickle:*:job:*")]
    assert all(private_redis.zcard(keys.queued_jobs(s)) == 0 for s in range(keys.SHARDS))


def test_a_job_record_goes_before_its_task(settings: Settings, private_redis: redis.Redis) -> None:
    """What a worker reads when the task arrives is already there: record, then publish."""
    private_redis.flushdb()
    private = on_private_redis(settings, private_redis)
    app = make_celery(private, ["demo"])
    store = JobStore(private_redis, 60, 60)
    job = Job(new_job_id(), "demo", "hi", GenerationParams(), created_at=time.time())
    store.create(job)
    enqueue_generation(app, job.id, "demo")
    with app.connection_for_read() as conn:
        channel = conn.channel()
        message = channel.basic_get(keys.model_queue("demo"), no_ack=True)
        channel.close()
    assert message is not None and message.decode()[0] == [job.id]
    assert store.status(job.id) is not None


def fetch_order(app: Celery, count: int) -> list[str]:
    """What one Celery-like consumer of every generate queue (prefetch 1, acks each before the
    next) fetches, in order: the job ids."""
    fetched: list[str] = []
    names = tenant_queues(app).names()
    with app.connection_for_read() as conn:
        channel = conn.channel()
        channel.basic_qos(0, 1, False)

        def on_message(body: object, message: kombu.Message) -> None:
            fetched.append(message.decode()[0][0])
            message.ack()

        queues = [app.amqp.queues[name] for name in names]
        with kombu.Consumer(channel, queues=queues, callbacks=[on_message]):
            while len(fetched) < count:
                conn.drain_events(timeout=2)
        channel.close()
    return fetched


def test_keys_take_turns_within_a_priority_and_weights_are_turns(
    settings: Settings, private_redis: redis.Redis
) -> None:
    """A floods first; B's jobs still go out one in every two fetches; W (weight 2) gets two
    turns per round against A; a batch job waits for every interactive one."""
    private_redis.flushdb()
    tables = {"a": {"key": "ka"}, "b": {"key": "kb"}, "w": {"key": "kw", "weight": 2}}
    keyed = dataclasses.replace(on_private_redis(settings, private_redis), keys=build_keys(tables))
    app = make_celery(keyed, ["demo"])
    enqueue_generation(app, "b-batch", "demo", BATCH_PRIORITY, tenant="b")
    for i in range(8):
        enqueue_generation(app, f"a-{i}", "demo", tenant="a")
    for i in range(3):
        enqueue_generation(app, f"b-{i}", "demo", tenant="b")
    fetched = fetch_order(app, 12)
    assert [job for job in fetched if job.startswith("b-") and job != "b-batch"] == [
        "b-0",
        "b-1",
        "b-2",
    ]
    assert max(fetched.index(f"b-{i}") for i in range(3)) <= 5  # turns, not after A's 8
    assert fetched[-1] == "b-batch"
    for i in range(9):
        enqueue_generation(app, f"a-{i}", "demo", tenant="a")
        enqueue_generation(app, f"w-{i}", "demo", tenant="w")
    first_round = fetch_order(app, 18)[:9]
    assert sum(job.startswith("w-") for job in first_round) == 6  # 2 of every 3 turns
