"""StoreBase: the connection, the scripts and the pipelines every part of ``JobStore`` uses.

``JobStore`` is split by who calls what: the web tier's records and reads (``store``), a
worker's ownership transitions (``store_ownership``) and its output (``store_output``); they
share this base, so a script is registered, loaded and retried in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.exceptions import NoScriptError

from worker import keys, scripts
from worker.node_pipeline import NodePipeline
from worker.redis_connection import is_cluster, publish_command

SCRIPT_NAMES = (
    "CREATE_ONCE",
    "CLAIM",
    "CANCEL",
    "RENEW",
    "RECOVER",
    "RELEASE",
    "EXPIRE_QUEUED",
    "APPEND_STEP",
    "FINISH",
    "SUM_PER_SHARD",
)


def ownership_keys(job_id: str) -> list[str]:
    """The keys CLAIM, RECOVER and RELEASE touch, in the order the scripts expect them."""
    shard = keys.shard_of(job_id)
    return [
        keys.job(job_id),
        keys.job_lease(job_id),
        keys.running_jobs(shard),
        keys.queued_jobs(shard),
        *ending_keys(job_id),
    ]


def ending_keys(job_id: str) -> list[str]:
    """What a transition that may end the job touches last: its replay log, its output so far
    and the two channels its done message goes to."""
    return [
        keys.job_tokens(job_id),
        keys.job_output(job_id),
        keys.job_events_channel(job_id),
        keys.job_done_channel(job_id),
    ]


class StoreBase:
    """The Redis client, its scripts (loaded once, reloaded after NOSCRIPT) and pipelines."""

    def __init__(self, client: Any, result_ttl_seconds: int, queued_ttl_seconds: int):
        self.redis = client
        self.result_ttl_seconds = result_ttl_seconds
        self.queued_ttl_seconds = queued_ttl_seconds
        self.cluster = is_cluster(client)
        self.publish = publish_command(client)
        self._loaded = False
        self._scripts = {
            name: client.register_script(getattr(scripts, name)) for name in SCRIPT_NAMES
        }

    def pipeline(self, transaction: bool = False) -> Any:
        """A pipeline that may carry script calls (per node on a cluster: ``node_pipeline``);
        a transaction must stay within one job's keys (one slot on a cluster)."""
        if self.cluster:
            return NodePipeline(self.redis, transaction)
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
        """Add one script call to ``pipe`` (loading the scripts first, once per store)."""
        if not self._loaded:
            self.load_scripts()
        pipe.evalsha(self._scripts[name].sha, len(script_keys), *script_keys, *args)

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

    def running_ids(self) -> list[str]:
        """Every job some worker holds (or held, until a sweep notices it died)."""
        members = self._per_shard("zrange", keys.running_jobs, 0, -1)
        return [str(job_id) for shard in members for job_id in shard]

    def _sum_per_shard(self, command: str, key: Callable[[int], str], *args: Any) -> int:
        """The sum of a counting command over every shard's index. On a single server one
        script loops over them: a pipeline of 256 commands cost milliseconds of Python (on
        every stream that starts while its job is queued, for its position)."""
        if self.cluster:
            return int(sum(self._per_shard(command, key, *args)))
        shards = [key(shard) for shard in range(keys.SHARDS)]
        (total,) = self.execute(
            lambda pipe: self.queue_script(pipe, "SUM_PER_SHARD", shards, [command, *args])
        )
        return int(total)

    def _per_shard(self, command: str, key: Any, *args: Any, **options: Any) -> list[Any]:
        """One command per shard's index, in one pipelined round trip (per node on a cluster)."""
        pipe = self.pipeline()
        for shard in range(keys.SHARDS):
            getattr(pipe, command)(key(shard), *args, **options)
        return list(pipe.execute())
