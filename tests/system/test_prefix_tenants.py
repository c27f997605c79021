"""The shared-prefix cache is partitioned per API key, end to end: key B sending the chats key A
just sent finds nothing of A's cached system prompt (no hit on its first chats), and a shared
``cache_salt`` lets two keys share. On a real stack: Redis, gunicorn, a Celery worker, the demo
model; hits and misses read from /metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.faultstack import FaultStack, build_fault_stack
from tests.metrics_text import parse_samples

SYSTEM = "You are a careful assistant. Answer briefly, and say so when unsure. " * 4
USERS = ("Hi", "What is a socket", "Name a prime")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    root = tmp_path_factory.mktemp("prefix-tenants")
    stack = build_fault_stack(
        root,
        models_toml=f'[models.demo]\npath = "{demo_model_dir}"\nprefix_min_tokens = 16\n',
        settings_toml='[auth]\napi_keys = ["key-a", "key-b"]\n',
    )
    stack.worker("runner", ("demo",))
    yield stack
    stack.close()


def chat(stack: FaultStack, key: str, user: str, system: str = SYSTEM, **extra: object) -> None:
    body = {
        "model": "demo",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 2,
        "temperature": 0,
        **extra,
    }
    response = requests.post(
        f"{stack.web_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text


def hits_and_misses(stack: FaultStack) -> tuple[float, float]:
    text = requests.get(
        f"{stack.web_url}/metrics", headers={"Authorization": "Bearer key-a"}, timeout=10
    ).text
    samples = parse_samples(text)
    return (
        samples.get('trickle_prefix_cache_hits_total{model="demo"}', 0.0),
        samples.get('trickle_prefix_cache_misses_total{model="demo"}', 0.0),
    )


def reaches(stack: FaultStack, expected: tuple[float, float]) -> None:
    """The counts reach ``expected`` (the worker flushes its counters every so often)."""
    deadline = time.monotonic() + 15
    while (found := hits_and_misses(stack)) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert found == expected


def test_another_keys_chats_never_hit_a_keys_cached_prefix(keyed: FaultStack) -> None:
    before_hits, before_misses = hits_and_misses(keyed)
    for user in USERS:
        chat(keyed, "key-a", user)
    # A: the first chat has nothing to share with, the second learns and computes the prefix,
    # the third hits it.
    reaches(keyed, (before_hits + 1, before_misses + 1))
    for user in USERS:
        chat(keyed, "key-b", user)
    # B, the same chats: no prefix at first (A's is not B's), then B's own, computed, then a hit.
    reaches(keyed, (before_hits + 2, before_misses + 2))


def test_keys_that_send_the_same_cache_salt_share(keyed: FaultStack) -> None:
    system = "Be exact and kind. " + SYSTEM  # an opening no earlier test cached
    before_hits, before_misses = hits_and_misses(keyed)
    chat(keyed, "key-a", USERS[0], system, cache_salt="team")
    chat(keyed, "key-a", USERS[1], system, cache_salt="team")
    reaches(keyed, (before_hits, before_misses + 1))
    chat(keyed, "key-b", USERS[2], system, cache_salt="team")  # B's first chat: a hit
    reaches(keyed, (before_hits + 1, before_misses + 1))
