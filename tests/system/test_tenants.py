"""Named keys on a real worker and web tier: max_running_jobs holds a key's extra jobs (paused
queue, widened prefetch) while another key's job runs; a flood of one key that fills every lane
leaves another key's job the reserve lane; every job succeeds, and usage per key name reaches
/metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.faultstack import FaultStack, build_fault_stack, wait_for
from tests.metrics_text import parse_samples
from trickle import keys

pytestmark = pytest.mark.timeout(120)
CAPPED, FREE, FLOOD, OPERATOR = "key-capped", "key-free", "key-flood", "key-operator"
BODY = {"prompt": "once upon a time", "max_tokens": 300, "ignore_eos": True}


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    stack = build_fault_stack(
        tmp_path_factory.mktemp("tenants"),
        # One lane of 4 slots (and, with named keys, a reserve lane of 4 more).
        models_toml=(
            f'[models.demo]\npath = "{demo_model_dir}"\nmax_batch_size = 4\ninter_threads = 1\n'
        ),
        settings_toml=(
            f'[auth]\napi_keys = ["{OPERATOR}"]\n'
            f'[keys.capped]\nkey = "{CAPPED}"\nmax_running_jobs = 1\n'
            f'[keys.free]\nkey = "{FREE}"\n'
            f'[keys.flood]\nkey = "{FLOOD}"\n'
        ),
    )
    stack.worker("tenants", ("demo",))
    yield stack
    stack.close()


def post(stack: FaultStack, key: str, **body: Any) -> str:
    response = requests.post(
        f"{stack.web_url}/v1/jobs",
        json={**BODY, **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def statuses(stack: FaultStack, job_ids: list[str]) -> list[str]:
    """The jobs' statuses at one instant (MULTI/EXEC): read one by one, a job that ended
    between two reads showed as still running beside the next one it let start."""
    client = stack.client()
    try:
        with client.pipeline(transaction=True) as snapshot:
            for job_id in job_ids:
                snapshot.hget(keys.job(job_id), "status")
            return [str(status) for status in snapshot.execute()]
    finally:
        client.close()


def test_a_capped_keys_jobs_run_one_at_a_time_and_all_succeed(tenants: FaultStack) -> None:
    capped = [post(tenants, CAPPED) for _ in range(4)]
    free = post(tenants, FREE)
    most_running = 0
    free_done_while_capped_waited = False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        now: list[Any] = statuses(tenants, [*capped, free])
        most_running = max(most_running, now[:4].count("running"))
        if now[4] == "succeeded" and "queued" in now[:4]:
            free_done_while_capped_waited = True
        if all(status == "succeeded" for status in now):
            break
        time.sleep(0.02)
    assert statuses(tenants, [*capped, free]) == ["succeeded"] * 5
    assert most_running == 1
    assert free_done_while_capped_waited  # the free key was not held behind the capped one
    client = tenants.client()
    # Every slot given back: the worker releases a job's slot just after storing its result.
    wait_for(lambda: client.zcard(keys.key_running("capped")) == 0, 10, "the capped key's slots")
    client.close()


def test_usage_per_key_name_reaches_metrics(tenants: FaultStack) -> None:
    job = post(tenants, FREE)
    wait_for(lambda: statuses(tenants, [job]) == ["succeeded"], 30, "the free key's job")

    def samples() -> dict[str, float]:
        text = requests.get(
            f"{tenants.web_url}/metrics", headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=5
        ).text
        assert FREE not in text and CAPPED not in text
        return parse_samples(text)

    found = wait_for(
        lambda: (
            (s := samples()).get('trickle_key_completion_tokens_total{key="free",model="demo"}')
            and s
        ),
        15,
        "the free key's usage in /metrics",
    )
    assert found['trickle_key_jobs_total{key="free",model="demo",status="succeeded"}'] >= 1
    assert found['trickle_key_prompt_tokens_total{key="free",model="demo"}'] > 0


def test_a_flood_that_fills_every_lane_leaves_another_key_the_reserve_lane(
    tenants: FaultStack,
) -> None:
    """The flood's first batch is far enough along that joining it would pause its streams
    too long, and its key holds every ordinary slot: without the reserve lane the other key's
    job would wait for that batch to end (with ``reserve_lane = false`` this fails)."""
    flood = [post(tenants, FLOOD, max_tokens=400) for _ in range(8)]
    client = tenants.client()
    try:
        wait_for(
            lambda: client.llen(keys.job_tokens(flood[0])) >= 100, 60, "the flood's first batch"
        )
        free = post(tenants, FREE, max_tokens=4)
        wait_for(lambda: statuses(tenants, [free]) == ["succeeded"], 30, "the other key's job")
        during = statuses(tenants, flood)
        assert client.llen(keys.job_tokens(flood[0])) < 400, "it waited for the flood's batch"
        # The flood held to the ordinary lane's 4 slots: the rest waited, unclaimed.
        assert during[:4] == ["running"] * 4 and during[4:] == ["queued"] * 4, during
        wait_for(lambda: statuses(tenants, flood) == ["succeeded"] * 8, 60, "the whole flood")
    finally:
        client.close()
