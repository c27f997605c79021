"""Plain API keys (``TRICKLE_API_KEYS=a,b``, no ``[keys.<name>]`` tables) are tenants on a real
worker and web tier: one key's flood of every slot leaves the other key's stream its start
(not FIFO behind the flood), usage is counted per key under a name derived from its digest,
and no key appears in metrics or in Redis; a deployment of 200 plain keys serves jobs from
keys across the list."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.clients import read_sse
from tests.faultstack import FaultStack, build_fault_stack, plain_key_stack, wait_for
from tests.metrics_text import parse_samples
from tests.system.test_tenants import statuses
from trickle import keys

pytestmark = pytest.mark.timeout(180)
ALPHA, BRAVO = "alpha-plain-secret", "bravo-plain-secret"
CROWD = [f"crowd-plain-secret-{i:03d}" for i in range(200)]
# One lane of 4 slots (and, with two keys or more, a reserve lane of 4 more).
SMALL_MODEL = "max_batch_size = 4\ninter_threads = 1\n"


def tenant_name(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    root = tmp_path_factory.mktemp("pair")
    stack = plain_key_stack(root, "pair", demo_model_dir, (ALPHA, BRAVO), SMALL_MODEL)
    yield stack
    stack.close()


def post(stack: FaultStack, key: str, **body: Any) -> str:
    response = requests.post(
        f"{stack.web_url}/v1/jobs",
        json={"prompt": "once upon a time", "ignore_eos": True, **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_an_unknown_key_is_still_401(pair: FaultStack) -> None:
    response = requests.post(
        f"{pair.web_url}/v1/jobs",
        json={"prompt": "x", "max_tokens": 1},
        headers={"Authorization": "Bearer charlie-not-configured"},
        timeout=10,
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_one_plain_keys_flood_leaves_the_other_keys_stream_its_start(pair: FaultStack) -> None:
    """Key A fills every ordinary slot and queues as many jobs again; key B's stream must start
    while A's first batch still runs and A's queued jobs still wait: B is not FIFO behind A.
    (With the two keys as one tenant, as before every key was one, B waited for A's batch.)"""
    flood = [post(pair, ALPHA, max_tokens=400) for _ in range(8)]
    client = pair.client()
    try:
        wait_for(lambda: client.llen(keys.job_tokens(flood[0])) >= 100, 60, "A's first batch")
        stream_of_b = post(pair, BRAVO, max_tokens=16)
        first = read_sse(
            pair.web_url,
            stream_of_b,
            headers={"Authorization": f"Bearer {BRAVO}"},
            max_tokens=1,
            timeout=30,
        )
        during = statuses(pair, flood)
        a_tokens = client.llen(keys.job_tokens(flood[0]))
        assert first.tokens and first.tokens[0]["index"] == 0
        assert a_tokens < 400, "B's first token waited for A's batch to end"
        # A holds the ordinary lane's 4 slots; its other 4 jobs still wait behind B's.
        assert during[:4] == ["running"] * 4 and during[4:] == ["queued"] * 4, during
        wait_for(lambda: statuses(pair, [stream_of_b]) == ["succeeded"], 30, "B's job")
        wait_for(lambda: statuses(pair, flood) == ["succeeded"] * 8, 90, "A's whole flood")
    finally:
        client.close()


def test_usage_per_plain_key_is_counted_under_its_digests_name(pair: FaultStack) -> None:
    job = post(pair, BRAVO, max_tokens=4)
    wait_for(lambda: statuses(pair, [job]) == ["succeeded"], 30, "B's job")
    name = tenant_name(BRAVO)
    metric = f'trickle_key_completion_tokens_total{{key="{name}",model="demo"}}'

    def scrape() -> str:
        headers = {"Authorization": f"Bearer {ALPHA}"}
        return requests.get(f"{pair.web_url}/metrics", headers=headers, timeout=5).text

    text = wait_for(lambda: (found := scrape()) and metric in found and found, 15, "B's usage")
    assert parse_samples(text)[metric] > 0
    assert ALPHA not in text and BRAVO not in text
    client = pair.client()
    try:
        for name_in_redis in client.scan_iter(count=1000):
            assert ALPHA not in name_in_redis and BRAVO not in name_in_redis
            assert hashlib.sha256(BRAVO.encode()).hexdigest() not in name_in_redis
    finally:
        client.close()


@pytest.fixture(scope="module")
def crowd(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    listed = ", ".join(f'"{key}"' for key in CROWD)
    stack = build_fault_stack(
        tmp_path_factory.mktemp("crowd"),
        models_toml=f'[models.demo]\npath = "{demo_model_dir}"\n{SMALL_MODEL}',
        settings_toml=f"[auth]\napi_keys = [{listed}]\n",
    )
    yield stack  # its worker starts in the test, once the jobs are queued
    stack.close()


def test_two_hundred_plain_keys_each_have_a_queue_and_their_jobs_all_run(
    crowd: FaultStack,
) -> None:
    chosen = [*CROWD[::20], CROWD[-1]]  # 11 keys from the first to the last
    jobs = {key: [post(crowd, key, max_tokens=8) for _ in range(2)] for key in chosen}
    every = [job for pair_of_jobs in jobs.values() for job in pair_of_jobs]
    client = crowd.client()
    try:
        # No worker yet: each key's two jobs wait on its own queue, none on the model's.
        for key in chosen:
            assert client.llen(keys.tenant_queue("demo", tenant_name(key))) == 2, key
        assert client.llen(keys.model_queue("demo")) == 0
        # One worker consumes all 201 queues of the model (and the webhooks').
        started = time.monotonic()
        crowd.worker("crowd", ("demo",))
        wait_for(lambda: set(statuses(crowd, every)) == {"succeeded"}, 90, "every key's jobs")
        took = time.monotonic() - started
        print(
            f"200 keys: a worker started and ran {len(every)} jobs of {len(chosen)} keys "
            f"in {took:.2f} s"
        )
        for key in chosen:
            assert client.llen(keys.tenant_queue("demo", tenant_name(key))) == 0
    finally:
        client.close()
    labels = [
        f'trickle_key_jobs_total{{key="{tenant_name(key)}",model="demo",status="succeeded"}}'
        for key in chosen
    ]

    def counted() -> bool:
        headers = {"Authorization": f"Bearer {CROWD[0]}"}
        text = requests.get(f"{crowd.web_url}/metrics", headers=headers, timeout=5).text
        samples = parse_samples(text)
        return all(samples.get(label) == 2 for label in labels)

    # A worker counts a job just after storing its result: the last ones may come a bit later.
    wait_for(counted, 15, "two succeeded jobs counted under each key's name")
