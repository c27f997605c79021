"""A restarted worker lets go at once of what its previous life held.

`trickle up` restarts a dead worker under the same node name (its ``$PORT``). The jobs it was
running still carry leases fenced ``<node>:<attempt>``, which would lapse only after
``lease_seconds``. No live worker holds that node's fences but this one, so at start-up it drops
them and its first sweep requeues those jobs: a client's stream pauses for the restart, not for
the lease. Were two live workers ever given one node name, the fences still keep a job's writes
single: the older copy's next renewal or write is refused and it stops itself.
"""

from __future__ import annotations

from trickle import keys
from trickle.store.job_store import JobStore

# KEYS: lease; ARGV: "<node>:" -> 1 if the lease was this node's and is now gone.
DROP_IF_OURS = """
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, 1, string.len(ARGV[1])) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


def release_previous_life(store: JobStore, node: str) -> list[str]:
    """Drop the leases a previous process with this node name held; returns their job ids."""
    script = store.redis.register_script(DROP_IF_OURS)
    dropped = []
    for job_id in store.leases.running_ids():
        if script(keys=[keys.job_lease(job_id)], args=[f"{node}:"]):
            dropped.append(job_id)
    return dropped
