"""The RabbitMQ queue layout, without a broker: what each app declares and where jobs go.

The stack on a real RabbitMQ node is tests/system/test_rabbitmq.py; this pins the declarations that
decide durability and the interactive/batch split, and the Redis transport left as it was.
"""

from __future__ import annotations

import dataclasses

from worker import keys
from worker.amqp_queues import batch_queue_of, consume_interactive_only, is_amqp
from worker.batch_feeder import job_id_of
from worker.config import BrokerSettings, Settings
from worker.queueing import make_celery


def on_rabbitmq(settings: Settings) -> Settings:
    return dataclasses.replace(settings, broker=BrokerSettings(url="amqp://guest@mq//"))


def test_every_queue_on_rabbitmq_is_a_durable_quorum_queue(settings: Settings) -> None:
    app = make_celery(on_rabbitmq(settings), ["demo"])
    queues = app.amqp.queues
    names = {keys.model_queue("demo"), keys.model_batch_queue("demo"), keys.WEBHOOK_QUEUE}
    assert set(queues) == names
    for queue in queues.values():
        assert queue.durable and not queue.auto_delete
        assert queue.queue_arguments == {"x-queue-type": "quorum", "x-delivery-limit": 10}
        # Topic, so Celery's native delayed delivery can route webhook retries back.
        assert (queue.exchange.name, queue.exchange.type) == (keys.AMQP_EXCHANGE, "topic")
        assert queue.routing_key == queue.name
    assert app.conf.worker_prefetch_multiplier == 1 and app.conf.task_acks_late
    assert app.conf.broker_transport_options == {"confirm_publish": True}


def test_batch_work_has_its_own_queue_only_on_rabbitmq(settings: Settings) -> None:
    assert batch_queue_of(make_celery(on_rabbitmq(settings), ["demo"]), "demo") == (
        "trickle.demo.batch"
    )
    on_redis = make_celery(settings, ["demo"])
    assert batch_queue_of(on_redis, "demo") is None  # one queue, kombu's priority steps
    assert set(on_redis.amqp.queues) == {keys.model_queue("demo"), keys.WEBHOOK_QUEUE}
    assert not is_amqp(settings.broker_url)


def test_celery_consumes_no_batch_queue_on_rabbitmq(settings: Settings) -> None:
    app = make_celery(on_rabbitmq(settings), ["demo"])
    consume_interactive_only(app, ["demo"])
    assert set(app.amqp.queues.consume_from) == {keys.model_queue("demo"), keys.WEBHOOK_QUEUE}


def test_the_feeder_reads_the_job_id_of_generate_messages_only() -> None:
    assert job_id_of({"task": keys.GENERATE_TASK}, [["job_1"], {}, {}]) == "job_1"
    assert job_id_of({"task": keys.WEBHOOK_TASK}, [["job_1"], {}, {}]) is None
    assert job_id_of({"task": keys.GENERATE_TASK}, [[], {}, {}]) is None
    assert job_id_of({}, None) is None
