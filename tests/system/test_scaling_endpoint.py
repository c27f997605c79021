"""The scaling endpoint on the running stack: what KEDA reads."""

from __future__ import annotations

import requests


def test_scaling_endpoint_hands_keda_the_demand(stack_url: str) -> None:
    body = requests.get(f"{stack_url}/scaling/demo", timeout=10).json()
    assert body["model"] == "demo" and body["workers"] >= 1
    assert body["slots_per_worker"] == 16 and body["total_slots"] >= 16
    assert body["demand_slots"] == body["queue_depth"] + body["busy_slots"]
    missing = requests.get(f"{stack_url}/scaling/nope", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
