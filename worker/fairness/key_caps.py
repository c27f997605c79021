"""``max_running_jobs`` per named key, enforced where a job is claimed: over its cap a job
waits (its message held unacked), it is never failed.

Every worker counts a key's running jobs in one Redis sorted set (``keys.key_running``): a job
enters when a worker takes it and leaves when it ends there. An entry lapses after
``max_job_seconds`` plus a lease, so a worker killed mid-job cannot hold its key's slots for
longer than a job may run (its job, recovered, enters again under the same id).

A worker that holds a key's job over the cap stops consuming that key's queues until the job
could start (``worker.dispatch.QueueSwitches``: Celery's ``cancel_task_queue`` and
``add_task_queue`` on the consumer's thread), and raises its prefetch window by each held
message (as Celery does for ETA tasks): a capped key holds at most a few messages per
worker, and never a slot another key's job could use.
"""

from __future__ import annotations

import logging
import time

import redis

from trickle import keys
from trickle.tenants import TenantTable

log = logging.getLogger(__name__)

# KEYS: the key's running set   ARGV: now, cap, lapses at, job ids...   -> the ids admitted
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local cap = tonumber(ARGV[2])
local admitted = {}
for i = 4, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    admitted[#admitted + 1] = ARGV[i]
  elseif redis.call('ZCARD', KEYS[1]) < cap then
    redis.call('ZADD', KEYS[1], ARGV[3], ARGV[i])
    admitted[#admitted + 1] = ARGV[i]
  end
end
return admitted
"""


class KeyCaps:
    """The running-job caps of named keys, shared by every worker through Redis."""

    def __init__(self, client: redis.Redis, tenants: TenantTable, entry_seconds: float):
        self._client = client
        self._tenants = tenants
        self._entry_seconds = entry_seconds
        self._take = client.register_script(_TAKE)

    def capped(self, tenant: str) -> bool:
        return bool(tenant) and self._tenants.max_running(tenant) > 0

    def take(self, tenant: str, job_ids: list[str]) -> set[str]:
        """The jobs that may start now (in order, up to the key's free slots)."""
        now = time.time()
        admitted = self._take(
            keys=[keys.key_running(tenant)],
            args=[now, self._tenants.max_running(tenant), now + self._entry_seconds, *job_ids],
        )
        return {
            str(job_id.decode() if isinstance(job_id, bytes) else job_id) for job_id in admitted
        }

    def release(self, tenant: str, job_id: str) -> None:
        try:
            self._client.zrem(keys.key_running(tenant), job_id)
        except redis.RedisError:  # its entry lapses on its own
            log.warning("could not release %s's slot of key %s", job_id, tenant, exc_info=True)
