"""ScriptRunner: the job Redis as ``JobStore`` and its ``Leases`` use it.

The client, its Lua scripts (``scripts``: registered once, loaded once, run by digest and
loaded again after NOSCRIPT), pipelines that may carry script calls (per node on a cluster:
``node_pipeline``) and the reads that cover every shard's index. The store and its leases each
hold the same runner, so a script is registered, loaded and retried in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redis.exceptions import NoScriptError

from trickle import keys
from trickle.store import scripts
from trickle.store.node_pipeline import NodePipeline
from trickle.store.redis_connection import is_cluster, publish_command

SCRIPT_NAMES = (
    "CREATE_ONCE",
    "CLAIM",
    "CANCEL",
    "RENEW",
    "RECOVER",
    "RELEASE",
    "FORGIVE_LAPSE",
    "EXPIRE_QUEUED",
    "EXPIRE_AT_DEADLINE",
    "APPEND_STEP",
    "FINISH",
    "SUM_PER_SHARD",
    "QUEUE_POSITION",
    "READ",
)
# A cluster pipeline sends to every node at once, on up to this many threads.
NODE_THREADS = 16


def ending_keys(job_id: str) -> list[str]:
    """What a transition that may end the job touches last: its replay log, its output so far
    and the two channels its done message goes to."""
    return [
        keys.job_tokens(job_id),
        keys.job_output(job_id),
        keys.job_events_channel(job_id),
        keys.job_done_channel(job_id),
    ]


class ScriptRunner:
    """The Redis client, its scripts (loaded once, reloaded after NOSCRIPT) and pipelines."""

    def __init__(self, client: Any):
        self.redis = client
        self.cluster = is_cluster(client)
        self.publish = publish_command(client)
        self._loaded = False
        self._scripts = {
            name: client.register_script(getattr(scripts, name)) for name in SCRIPT_NAMES
        }
        # Only a cluster's node pipelines use it; its threads start on first use.
        self._node_threads = (
            ThreadPoolExecutor(max_workers=NODE_THREADS, thread_name_prefix="trickle-nodes")
            if self.cluster
            else None
        )

    def pipeline(self, transaction: bool = False) -> Any:
        """A pipeline that may carry script calls (per node on a cluster: ``node_pipeline``);
        a transaction must stay within one job's keys (one slot on a cluster)."""
        if self._node_threads is not None:
            return NodePipeline(self.redis, self._node_threads, transaction)
        return self.redis.pipeline(transaction=transaction)

    def load_scripts(self) -> None:
        """Put every script in the server's cache (each primary's, on a cluster). Pipelines
        call scripts by digest alone: redis-py would otherwise ask SCRIPT EXISTS before every
        pipeline, a round trip per decoding step. A server that lost them (restarted, failed
        over) answers NOSCRIPT, and the caller loads them again and retries."""
        for script in self._scripts.values():
            script.sha = self.redis.script_load(script.script)
        self._loaded = True

    def queue_script(self, pipe: Any, name: str, script_keys: list[str], args: list[Any]) -> None:
        """Add one script call to ``pipe`` (loading the scripts first, once per runner)."""
        if not self._loaded:
            self.load_scripts()
        pipe.evalsha(self._scripts[name].sha, len(script_keys), *script_keys, *args)

    def run(self, name: str, script_keys: list[str], args: list[Any]) -> Any:
        """One script call on its own (redis-py loads the script itself after NOSCRIPT)."""
        return self._scripts[name](keys=script_keys, args=args)

    def execute(self, build: Callable[[Any], None]) -> list[Any]:
        """Build and run a pipeline of script calls; once more if the server lacked them (each
        script is a guarded transition: a call that ran already is refused or repeated as a
        no-op)."""
        for attempt in (1, 2):
            pipe = self.pipeline()
            build(pipe)
            try:
                return list(pipe.execute())
            except NoScriptError:
                if attempt == 2:
                    raise
                self.scripts_lost()
        raise AssertionError("unreachable")

    def scripts_lost(self) -> None:
        """The server answered NOSCRIPT: the next script call loads them all again."""
        self._loaded = False

    def sum_per_shard(self, command: str, key: Callable[[int], str], *args: Any) -> int:
        """The sum of a counting command over every shard's index. On a single server one
        script loops over them: a pipeline of 256 commands cost milliseconds of Python (on
        every stream that starts while its job is queued, for its position)."""
        if self.cluster:
            return int(sum(self.per_shard(command, key, *args)))
        shards = list(keys.every_shard(key))
        (total,) = self.execute(
            lambda pipe: self.queue_script(pipe, "SUM_PER_SHARD", shards, [command, *args])
        )
        return int(total)

    def per_shard(self, command: str, key: Any, *args: Any, **options: Any) -> list[Any]:
        """One command per shard's index, in one pipelined round trip (per node on a cluster)."""
        pipe = self.pipeline()
        for shard in range(keys.SHARDS):
            getattr(pipe, command)(key(shard), *args, **options)
        return list(pipe.execute())


class WriteRecorder:
    """Stands in for a pipeline: records the writes queued on it as [command, key index, args]
    for the CREATE_ONCE script, and the keys they touch (KEYS[1] is the idempotency key)."""

    def __init__(self, first_key: str):
        self.keys = [first_key]
        self.writes: list[list[Any]] = []
        self._positions = {first_key: 1}  # a batch's thousands of keys: no list scans

    def _key(self, name: str) -> int:
        """The key's position in KEYS (Lua's start at 1), added at the end if new."""
        position = self._positions.get(name)
        if position is None:
            self.keys.append(name)
            position = self._positions[name] = len(self.keys)
        return position

    def hset(self, name: str, mapping: dict[str, Any]) -> None:
        flat = [str(part) for pair in mapping.items() for part in pair]
        self.writes.append(["HSET", self._key(name), *flat])

    def expire(self, name: str, seconds: int) -> None:
        self.writes.append(["EXPIRE", self._key(name), int(seconds)])

    def zadd(self, name: str, mapping: dict[str, float]) -> None:
        flat = [part for member, score in mapping.items() for part in (repr(score), member)]
        self.writes.append(["ZADD", self._key(name), *flat])

    def lpush(self, name: str, *values: str) -> None:
        """A task message (kombu's publish, see trickle.store.redis_transport.writing_into)."""
        self.writes.append(["LPUSH", self._key(name), *values])

    def rpush(self, name: str, *values: str) -> None:
        for start in range(0, len(values), 1000):  # Lua's unpack() takes a few thousand at most
            self.writes.append(["RPUSH", self._key(name), *values[start : start + 1000]])
