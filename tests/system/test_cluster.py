"""The whole service on a real Redis Cluster: job state, replay logs and tokens spread over three
primaries (each with a replica), sharded pub/sub for the token plane, Celery's queue on a Redis
of its own. The same contract as on one Redis: every token exactly once, in order, from any
point; cancel; a killed worker's job resumed by another; and a primary failed over in the
middle of a stream loses nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from ops.redis_server import free_port, start_redis, stop_redis
from tests import stack
from tests.clients import (
    StreamResult,
    get_job,
    poll_until_finished,
    read_sse,
    stream_in_background,
    submit,
)
from tests.faultstack import build_slow_model, tokens_streamed, wait_for
from tests.redis_cluster import LocalCluster, start_cluster
from trickle import keys
from trickle.jobs import Job, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore
from trickle.waiting_reader import MAX_QUEUED_READ, WaitEstimator, read_queued

LONG = {"model": "slow", "max_tokens": 1200, "ignore_eos": True, "temperature": 0}
pytestmark = pytest.mark.timeout(150)


@dataclass
class ClusterStack:
    cluster: LocalCluster
    config_path: Path
    log_dir: Path
    broker: subprocess.Popen[bytes]
    web_url: str = ""
    web: subprocess.Popen[bytes] | None = None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def worker(self, name: str) -> subprocess.Popen[bytes]:
        process = stack.start_worker(
            self.config_path, self.cluster.url, name, self.log_dir, models=("demo", "slow")
        )
        self.workers[name] = process
        return process

    def close(self) -> None:
        for process in [*self.workers.values(), *([self.web] if self.web else [])]:
            stack.stop(process)
        stop_redis(self.broker)
        self.cluster.close()


@pytest.fixture(scope="module")
def on_cluster(
    tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path
) -> Iterator[ClusterStack]:
    root = tmp_path_factory.mktemp("cluster")
    cluster = start_cluster(root / "nodes", primaries=3, replicas=1)
    broker_port = free_port()
    broker = start_redis(broker_port, root / "broker", append_only=False)
    slow = build_slow_model(
        root, demo_model_dir / "tokenizer.model", d_model=256, num_layers=4, ffn_dim=768
    )
    config = root / "cluster.toml"
    config.write_text(
        f"""default_model = "demo"
[redis]
url = "{cluster.url}"
[broker]
url = "redis://127.0.0.1:{broker_port}/0"
[worker]
lease_seconds = 2
recovery_interval_seconds = 0.5
heartbeat_seconds = 0.5
[web]
keepalive_seconds = 1.0
[limits]
max_tokens_ceiling = 2000
[models.demo]
path = "{demo_model_dir}"
[models.slow]
path = "{slow}"
max_batch_size = 4
intra_threads = 1
"""
    )
    log_dir = root / "logs"
    log_dir.mkdir()
    on = ClusterStack(cluster, config, log_dir, broker)
    try:
        port = free_port()
        on.web = stack.start_web(config, port, log_dir)
        on.web_url = f"http://127.0.0.1:{port}"
        on.worker("cluster-main")
    except BaseException:
        on.close()
        raise
    yield on
    on.close()


def assert_exactly_once(stream: StreamResult, first: int = 0) -> None:
    assert stream.done is not None, stream.error
    assert stream.indexes == list(range(first, first + stream.token_count))
    assert stream.done["usage"]["completion_tokens"] == first + stream.token_count
    if first == 0:
        assert stream.text == stream.done["output"]


def test_jobs_and_their_channels_spread_over_the_primaries(on_cluster: ClusterStack) -> None:
    jobs = [submit(on_cluster.web_url, {"prompt": "The", "max_tokens": 8}) for _ in range(12)]
    for job in jobs:
        poll_until_finished(on_cluster.web_url, job["id"])
    client = on_cluster.cluster.client()
    owners = {client.get_node_from_key(keys.job(job["id"])).name for job in jobs}
    assert len(owners) > 1  # 12 jobs over 256 shards over 3 primaries
    for job in jobs:  # what a job's scripts touch is on its own node
        node = client.get_node_from_key(keys.job(job["id"]))
        assert client.get_node_from_key(keys.job_events_channel(job["id"])) == node
        assert client.get_node_from_key(keys.job_tokens(job["id"])) == node


def test_a_stream_is_exactly_once_from_the_start_and_from_any_point(
    on_cluster: ClusterStack,
) -> None:
    body = {"prompt": "The socket module", "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    job = submit(on_cluster.web_url, body)
    whole = read_sse(on_cluster.web_url, job["id"])
    assert_exactly_once(whole)
    assert get_job(on_cluster.web_url, job["id"])["output"] == whole.text
    resumed = read_sse(on_cluster.web_url, job["id"], headers={"Last-Event-ID": "99"})
    assert_exactly_once(resumed, first=100)
    assert [t["text"] for t in resumed.tokens] == [t["text"] for t in whole.tokens[100:]]


def test_a_waiter_gets_the_finished_job(on_cluster: ClusterStack) -> None:
    job = submit(on_cluster.web_url, {"prompt": "Return the", "max_tokens": 40}, wait=30)
    assert job["status"] == "succeeded" and job["usage"]["completion_tokens"] > 0


def test_cancel_mid_stream_ends_the_stream_with_what_was_stored(on_cluster: ClusterStack) -> None:
    job = submit(on_cluster.web_url, {"prompt": "If", **LONG})
    reader, results = stream_in_background(on_cluster.web_url, job["id"])
    wait_for(lambda: tokens_streamed(on_cluster.web_url, job["id"]) >= 20, 30, "some tokens")
    requests.post(f"{on_cluster.web_url}/v1/jobs/{job['id']}/cancel", timeout=10)
    reader.join(60)
    (stream,) = results
    assert_exactly_once(stream)
    assert stream.done is not None and stream.done["status"] == "canceled"
    assert stream.token_count < LONG["max_tokens"]


def test_a_killed_workers_job_resumes_on_another_without_gap(on_cluster: ClusterStack) -> None:
    # Both workers up before the job (starting one mid-job could outlast the job on a busy
    # machine); the one holding its lease is killed.
    on_cluster.worker("cluster-heir")
    job = submit(on_cluster.web_url, {"prompt": "The", **LONG})
    reader, results = stream_in_background(on_cluster.web_url, job["id"])
    wait_for(lambda: tokens_streamed(on_cluster.web_url, job["id"]) >= 100, 30, "tokens")
    holder = str(on_cluster.cluster.client().get(keys.job_lease(job["id"])))
    name = holder.split("@", 1)[0]
    os.kill(on_cluster.workers[name].pid, signal.SIGKILL)  # reaped when the stack closes
    reader.join(120)
    (stream,) = results
    assert_exactly_once(stream)
    assert stream.done is not None and stream.done["status"] == "succeeded"
    assert stream.done["attempts"] == 2 and stream.token_count == LONG["max_tokens"]


def test_failing_over_the_jobs_primary_mid_stream_loses_nothing(on_cluster: ClusterStack) -> None:
    """A manual failover (the replica catches up, then takes over): the worker's next flush
    finds the slot moved and is sent again, the web tier's shard subscription is dropped by
    the demoted node and taken again on the new primary, and readers re-read the log."""
    job = submit(on_cluster.web_url, {"prompt": "Return", **LONG})
    reader, results = stream_in_background(on_cluster.web_url, job["id"])
    wait_for(lambda: tokens_streamed(on_cluster.web_url, job["id"]) >= 50, 30, "tokens")
    client = on_cluster.cluster.client()
    primary = client.get_node_from_key(keys.job(job["id"]))
    replica = next(
        port
        for port in on_cluster.cluster.ports
        if on_cluster.cluster.node(port).info("replication").get("master_port") == primary.port
    )
    assert on_cluster.cluster.node(replica).cluster("failover")
    wait_for(
        lambda: on_cluster.cluster.node(replica).info("replication")["role"] == "master",
        15,
        "the replica to take over",
    )
    reader.join(120)
    (stream,) = results
    assert_exactly_once(stream)
    assert stream.done is not None and stream.done["status"] == "succeeded"
    assert stream.token_count == LONG["max_tokens"]
    time.sleep(0.5)
    assert get_job(on_cluster.web_url, job["id"])["output"] == stream.text


def test_the_wait_estimate_reads_queued_jobs_across_the_primaries(
    on_cluster: ClusterStack,
) -> None:
    """Where a single Redis reads the queue with two scripts, a cluster reads it shard by shard
    and job by job (the jobs live on many slots): the same entries."""
    client = on_cluster.cluster.client()
    store = JobStore(client, result_ttl_seconds=60, queued_ttl_seconds=600)
    jobs = [
        Job(new_job_id(), "nobody-serves", "hi", GenerationParams(max_tokens=9 + index))
        for index in range(5)
    ]
    for index, job in enumerate(jobs):
        job.created_at = time.time() + index * 0.001
        store.create(job)
    try:
        queued = read_queued(client, MAX_QUEUED_READ)["nobody-serves"]
        assert [entry.job_id for entry in queued] == [job.id for job in jobs]
        assert [entry.max_tokens for entry in queued] == [9, 10, 11, 12, 13]
        found = WaitEstimator(client, heartbeat_ttl=10).estimate(jobs[2].id)
        assert found is not None and found.position == 2
    finally:
        store.cancel_many([job.id for job in jobs], time.time())
