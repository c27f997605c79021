"""Pin the Redis key schema: web and workers in different releases must agree on these strings."""

from __future__ import annotations

from trickle import keys


def test_exact_key_strings() -> None:
    assert keys.SHARDS == 256 and keys.shard_of("job_abc") == 83
    assert keys.job("job_abc") == "trickle:{s83}:job:job_abc"
    assert keys.job_tokens("job_abc") == "trickle:{s83}:job:job_abc:tokens"
    assert keys.job_output("job_abc") == "trickle:{s83}:job:job_abc:output"
    assert keys.job_events_channel("job_abc") == "trickle:{s83}:events:job_abc"
    assert keys.job_done_channel("job_abc") == "trickle:{s83}:done:job_abc"
    assert keys.job_of_channel("trickle:{s83}:done:job_abc") == "job_abc"
    assert keys.model_queue("demo") == "trickle.demo"
    assert keys.model_workers("demo") == "trickle:workers:demo"
    assert keys.GENERATE_TASK == "trickle.generate"
    assert keys.job_lease("job_abc") == "trickle:{s83}:job:job_abc:lease"
    assert keys.running_jobs(7) == "trickle:{s7}:running"
    assert keys.queued_jobs(7) == "trickle:{s7}:queued"
    assert keys.deadline_jobs(7) == "trickle:{s7}:deadlines"
    assert keys.deadlines_next() == "trickle:deadlines-next"
    assert keys.RATE_LIMIT_PREFIX == "trickle:ratelimit"
    assert keys.AMQP_EXCHANGE == "trickle"
    assert keys.worker_slots_key("w@h") == "trickle:worker:w@h:slots"
    assert keys.worker_outlook("w@h") == "trickle:worker:w@h:outlook"
    assert keys.AUTOSCALER == "trickle:autoscaler"
    assert keys.WEBHOOK_TASK == "trickle.webhook" and keys.WEBHOOK_QUEUE == "trickle.webhooks"
    assert keys.BATCH_QUEUE == "trickle.batches"
    assert keys.BATCH_INGEST_TASK == "trickle.batch_ingest"
    assert keys.BATCH_SETTLE_TASK == "trickle.batch_settle"
    assert keys.BATCH_SWEEP_TASK == "trickle.batch_sweep"
    assert keys.METRIC_COUNTERS == "trickle:metrics:counters"
    assert keys.metric_histogram("ttft") == "trickle:metrics:hist:ttft"
    assert keys.batch("batch_1") == "trickle:batch:{batch_1}"
    assert keys.batch_items("batch_1") == "trickle:batch:{batch_1}:items"
    assert keys.batch_ingest("batch_1") == "trickle:batch:{batch_1}:ingest"
    assert keys.batch_finalize("batch_1") == "trickle:batch:{batch_1}:finalize"
    assert keys.batch_output_settled("k", "batch_1") == "trickle:files:{k}:output-settled:batch_1"
    assert keys.batches_of("k") == "trickle:batches:{k}"
    assert keys.batches_of("") == "trickle:batches:{open}"
    assert keys.file("file-1") == "trickle:file:{file-1}"
    assert keys.file_chunks("file-1") == "trickle:file:{file-1}:chunks"
    assert keys.file_readers("file-1") == "trickle:file:{file-1}:readers"
    assert keys.files_of("k") == "trickle:files:{k}"
    assert keys.files_held("k") == "trickle:files:{k}:held"
    assert keys.files_held_bytes("k") == "trickle:files:{k}:held-bytes"
    assert keys.batch_inputs_held("k") == "trickle:batches:{k}:held"
    assert keys.batch_inputs_held_bytes("k") == "trickle:batches:{k}:held-bytes"
    assert keys.STREAM_SECRET == "trickle:stream-secret"
    assert keys.response("resp_1") == "trickle:response:{resp_1}"
    assert keys.idempotency("", "abc") == (
        "trickle:{s54}:idem:609f6e36d2405585188d5cfd761f407c7cc46a7d3f314c88270469dde315fcd1"
    )
    assert keys.idempotency_shard("", "abc") == 54


def test_an_idempotency_key_is_scoped_and_its_jobs_share_its_shard() -> None:
    from trickle.jobs import is_job_id, new_job_id

    assert keys.idempotency("owner-a", "k") != keys.idempotency("owner-b", "k")
    shard = keys.idempotency_shard("owner-a", "k")
    job_id = new_job_id(shard)
    assert is_job_id(job_id) and keys.shard_of(job_id) == shard
    assert keys.job(job_id).split(":job:")[0] == keys.idempotency("owner-a", "k").split(":idem:")[0]


def test_every_key_of_a_job_shares_one_cluster_hash_tag() -> None:
    """A job's scripts touch only keys of its shard: one slot on a Redis Cluster."""
    job_id = "job_0123456789abcdef0123456789abcdef"
    shard = keys.shard_of(job_id)
    names = [
        keys.job(job_id),
        keys.job_tokens(job_id),
        keys.job_output(job_id),
        keys.job_lease(job_id),
        keys.job_events_channel(job_id),
        keys.job_done_channel(job_id),
        keys.running_jobs(shard),
        keys.queued_jobs(shard),
    ]
    assert {name[name.index("{") : name.index("}") + 1] for name in names} == {f"{{s{shard}}}"}


def test_tenant_queue_names() -> None:
    assert keys.tenant_queue("demo", "") == "trickle.demo"
    assert keys.tenant_queue("demo", "alice") == "trickle.demo.key.alice"
    assert keys.tenant_queue("demo", "alice", 2) == "trickle.demo.key.alice.2"
    assert keys.key_running("alice") == "trickle:key:{alice}:running"
