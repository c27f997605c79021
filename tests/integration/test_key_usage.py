"""Usage per key name in /metrics: what a worker's accounting records for a named key's job is
what /metrics shows, labelled by the name (never the key); a named key cannot read /metrics."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable

import redis
from flask import Flask

from tests.metrics_text import parse_samples
from trickle.config.sections import AuthSettings
from trickle.config.settings import Settings
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, Job, JobStatus, Usage
from trickle.params import GenerationParams
from trickle.telemetry.metrics import MetricsRecorder
from trickle.tenants import TenantTable, build_keys, tenant_label
from worker.accounting import account_finished


def test_a_keys_usage_is_in_metrics_by_its_name(
    settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> None:
    name = f"usage-{uuid.uuid4().hex[:8]}"
    named = build_keys({name: {"key": f"secret-{name}"}})
    table = TenantTable(named)
    job = Job(
        "job_" + uuid.uuid4().hex,
        "demo",
        "x",
        GenerationParams(),
        usage=Usage(prompt_tokens=7),
        tenant_digest=named[name].digest,
    )
    result = JobResult(JobStatus.SUCCEEDED, "abc", FinishReason.LENGTH, 5, time.time())
    recorder = MetricsRecorder()
    key = tenant_label(table.name_of_digest(job.tenant_digest))
    for _ in range(2):
        account_finished(recorder, job, 1, result, None, 0, key)
    recorder.flush(redis_client)
    app = make_app(
        dataclasses.replace(settings, keys=named, auth=AuthSettings(metrics_token="ops"))
    ).test_client()
    assert (
        app.get("/metrics", headers={"Authorization": f"Bearer secret-{name}"}).status_code == 401
    )
    text = app.get("/metrics", headers={"Authorization": "Bearer ops"}).get_data(as_text=True)
    assert f"secret-{name}" not in text
    samples = parse_samples(text)
    labels = f'key="{name}",model="demo"'
    assert samples[f'trickle_key_jobs_total{{{labels},status="succeeded"}}'] == 2
    assert samples[f"trickle_key_prompt_tokens_total{{{labels}}}"] == 14
    assert samples[f"trickle_key_completion_tokens_total{{{labels}}}"] == 10
