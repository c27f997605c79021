"""Redis traffic per decoding step: PUBLISH messages on the token channels and Redis commands.

While a batch of concurrent jobs runs, a subscriber counts the messages on the jobs' token
channels (exact, whoever publishes; one message per job per worker flush) and ``INFO
commandstats`` is read before and after (every client: worker, web tier, Celery, this
subscriber; commands run inside Lua scripts count too).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import redis

from trickle import keys

WATCHED_COMMANDS = (
    "publish",
    "evalsha",
    "eval",
    "exec",
    "multi",
    "rpush",
    "lrange",
    "hgetall",
    "hget",
    "hset",
)


def command_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    calls = {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in stats.items()
        if isinstance(value, dict)
    }
    calls["_total_commands_processed"] = int(client.info("stats")["total_commands_processed"])
    return calls


class ChannelCounter:
    """Counts messages (and the tokens in them) on the token channel from a background thread."""

    def __init__(self, redis_url: str):
        self._client = redis.Redis.from_url(redis_url, decode_responses=True)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        # Every channel, so that PUBLISH calls elsewhere (Celery, ...) show up too.
        self._pubsub.psubscribe("*")
        self._pubsub.get_message(timeout=1.0)  # the subscribe confirmation
        self.other_channels: dict[str, int] = {}
        self._stop = threading.Event()
        self.messages = 0
        self.token_messages = 0
        self.tokens = 0
        self._thread = threading.Thread(target=self._run, name="bench-channel", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._pubsub.get_message(timeout=0.1)
            if message is None or message.get("type") != "pmessage":
                continue
            channel = str(message["channel"])
            if channel != keys.job_events_channel(keys.job_of_channel(channel)):
                name = str(message["channel"])
                self.other_channels[name] = self.other_channels.get(name, 0) + 1
                continue
            self.messages += 1
            count = len(json.loads(message["data"]).get("t", []))
            self.tokens += count
            self.token_messages += 1 if count else 0

    def close(self, drain_seconds: float = 0.5) -> None:
        """Stop after ``drain_seconds`` (messages published at the very end are still read)."""
        self._stop.wait(drain_seconds)
        self._stop.set()
        self._thread.join(timeout=5)
        self._pubsub.close()
        self._client.close()


def measure(
    client: redis.Redis,
    redis_url: str,
    max_tokens: int,
    run: Callable[[], dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``run`` (a concurrent e2e run) while counting; returns (its result, the counts)."""
    counter = ChannelCounter(redis_url)
    before = command_calls(client)
    try:
        result = run()
    finally:
        after = command_calls(client)
        counter.close()
    delta = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    batches: list[int] = result.get("batches_inferred") or []
    steps = len(batches) * max_tokens
    tokens = int(result.get("tokens") or 0)

    def per_step(value: float) -> float | None:
        return value / steps if steps else None

    counts = {
        "jobs": result.get("clients"),
        "batches_inferred": batches,
        "decoding_steps": steps,
        "tokens": tokens,
        "channel_messages": counter.messages,
        "channel_messages_with_tokens": counter.token_messages,
        "channel_tokens": counter.tokens,
        "messages_per_step": per_step(counter.messages),
        "token_messages_per_step": per_step(counter.token_messages),
        "tokens_per_message": counter.tokens / counter.token_messages
        if counter.token_messages
        else None,
        "messages_on_other_channels": counter.other_channels,
        "publish_calls": delta.get("publish", 0),
        "publish_per_step": per_step(delta.get("publish", 0)),
        "exec_calls": delta.get("exec", 0),
        "exec_per_step": per_step(delta.get("exec", 0)),
        "scripts_per_step": per_step(delta.get("evalsha", 0) + delta.get("eval", 0)),
        "commands": {name: delta.get(name, 0) for name in WATCHED_COMMANDS},
        "total_commands": delta["_total_commands_processed"],
        "commands_per_token": delta["_total_commands_processed"] / tokens if tokens else None,
    }
    return result, counts
