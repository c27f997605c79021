"""Pin the Redis key schema: web and workers in different releases must agree on these strings."""

from __future__ import annotations

from worker import keys


def test_exact_key_strings() -> None:
    assert keys.job("job_abc") == "trickle:job:job_abc"
    assert keys.job_tokens("job_abc") == "trickle:job:job_abc:tokens"
    assert keys.model_queue("demo") == "trickle.demo"
    assert keys.model_workers("demo") == "trickle:workers:demo"
    assert keys.EVENTS_CHANNEL == "trickle:events"
    assert keys.GENERATE_TASK == "trickle.generate"
    assert keys.job_lease("job_abc") == "trickle:job:job_abc:lease"
    assert keys.RUNNING_JOBS == "trickle:running"
    assert keys.QUEUED_JOBS == "trickle:queued"
    assert keys.rate_window("k1", "requests", 29_000_000) == "trickle:rate:k1:requests:29000000"
    assert keys.model_queue_list("demo", 0) == "trickle.demo"
    assert keys.model_queue_list("demo", 9) == "trickle.demo\x06\x169"
    assert keys.model_batch_queue("demo") == "trickle.demo.batch"
    assert keys.AMQP_EXCHANGE == "trickle"
    assert keys.worker_slots("w@h") == "trickle:worker:w@h:slots"
    assert keys.AUTOSCALER == "trickle:autoscaler"
    assert keys.WEBHOOK_TASK == "trickle.webhook" and keys.WEBHOOK_QUEUE == "trickle.webhooks"
    assert keys.METRIC_COUNTERS == "trickle:metrics:counters"
    assert keys.metric_histogram("ttft") == "trickle:metrics:hist:ttft"
    assert keys.batch("batch_1") == "trickle:batch:batch_1"
    assert keys.batch_items("batch_1") == "trickle:batch:batch_1:items"
    assert keys.STREAM_SECRET == "trickle:stream-secret"
