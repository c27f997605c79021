"""A pipeline over a Redis Cluster that may carry Lua script calls.

redis-py's cluster pipeline refuses EVALSHA, yet a publisher flush is a few script calls that
must cost one round trip, not one each. This one groups the queued commands by the node that
owns each command's first key (every key of a job shares its shard's hash tag, so one key
routes the call), sends each node's group as a plain pipeline, all nodes at once, and returns
the replies in the order the commands were queued. A slot map that changed under it (MOVED,
ASK, a failover's CLUSTERDOWN or READONLY, a dead connection) is read again and the whole
pipeline is sent again, a few times: every caller queues only reads and guarded, idempotent
writes. Past that it is a ConnectionError, which callers already handle (retry, or a 503).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)

# The slot map changed (MOVED, ASK), a failover is under way (CLUSTERDOWN, TRYAGAIN, a write to
# a demoted primary: READONLY), or a node went away.
TOPOLOGY_ERRORS = (
    AskError,
    TryAgainError,
    ClusterDownError,
    ReadOnlyError,
    SlotNotCoveredError,
    redis.ConnectionError,
    redis.TimeoutError,
)
RETRY_DELAYS_SECONDS = (0.0, 0.1, 0.3, 1.0)


class NodePipeline:
    """One pipeline's commands, sent to every node at once on ``threads`` (those its owner,
    ``ScriptRunner``, keeps for all its pipelines): a flush waits on one round trip per node."""

    def __init__(self, cluster: RedisCluster, threads: Executor, transaction: bool = False):
        self._cluster = cluster
        self._threads = threads
        self._transaction = transaction
        # (routing key, command, args, keyword args)
        self._commands: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        """Any command: ``pipe.hmget(key, ...)``; its first argument routes it."""

        def queue(*args: Any, **kwargs: Any) -> None:
            self._commands.append((str(args[0]), name, args, kwargs))

        return queue

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> None:
        key = str(keys_and_args[0])
        self._commands.append((key, "evalsha", (sha, numkeys, *keys_and_args), {}))

    def execute(self) -> list[Any]:
        last: Exception | None = None
        for delay in RETRY_DELAYS_SECONDS:
            time.sleep(delay)
            try:
                return self._execute_once()
            except TOPOLOGY_ERRORS as exc:
                last = exc
                with contextlib.suppress(redis.RedisError, RedisClusterException):
                    self._cluster.nodes_manager.initialize()  # where do the slots live now?
        # Callers retry a connection error (the publisher until Redis is back) or answer 503.
        raise redis.ConnectionError(f"Redis Cluster unavailable or moving slots: {last}") from last

    def _execute_once(self) -> list[Any]:
        groups: dict[str, list[int]] = {}
        nodes: dict[str, Any] = {}
        for position, (key, *_call) in enumerate(self._commands):
            node = self._cluster.get_node_from_key(key)
            groups.setdefault(node.name, []).append(position)
            nodes[node.name] = node
        replies: list[Any] = [None] * len(self._commands)
        connection = self._cluster.get_redis_connection
        futures = {
            name: self._threads.submit(self._send, connection(nodes[name]), group)
            for name, group in groups.items()
        }
        for name, future in futures.items():
            for position, reply in zip(groups[name], future.result(), strict=True):
                replies[position] = reply
        return replies

    def _send(self, node: redis.Redis, positions: list[int]) -> list[Any]:
        pipe = node.pipeline(transaction=self._transaction)
        for position in positions:
            _key, name, args, kwargs = self._commands[position]
            getattr(pipe, name)(*args, **kwargs)
        return list(pipe.execute())
