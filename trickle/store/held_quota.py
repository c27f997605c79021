"""A per-tenant quota whose holds are taken atomically, before what they pay for is written.

Checking the room, then writing, lets concurrent writers each see the same room and all take it
(six 52 MiB uploads stored 313 MiB against a 256 MiB quota). Here one script drops the holds
that lapsed, refuses a new holder past the count or bytes past the room, and adds the bytes, so
the sum never passes the quota. A hold lapses at its own time (what it pays for expires, or its
writer died) without anyone's help, and a holder's bytes are released when it is deleted.
"""

from __future__ import annotations

import time
from typing import Any

import redis

# Holds what counts against a quota, atomically: lapsed holds go, then a new holder (past the
# count) or bytes past the room are refused, else the bytes are added and the hold renewed.
# KEYS: holds (zset: holder -> lapses at), bytes (hash: holder -> bytes).
# ARGV: holder, bytes to add (negative: given back, down to zero at most), max bytes (-1:
# count them, refuse nothing), max holders, now, lapses at, TTL of both keys (only ever
# lengthened: other holds may last longer), a holder the bytes added are drawn from first
# ('' none: what it holds moves over, so only the rest is new room).
# Returns {0, used} or {-1, used} (bytes) or {-2, holders}; {0, -1} when nothing is added to
# an absent holder (a give-back never recreates a hold dropped with what it paid for).
HOLD_SCRIPT = """
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[5])
for _, holder in ipairs(lapsed) do redis.call('HDEL', KEYS[2], holder) end
if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[5]) end
local adding = tonumber(ARGV[2])
if adding <= 0 and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {0, -1}  -- nothing to give back: an absent holder (dropped, lapsed) stays absent
end
if adding < 0 then  -- a hold given back in part never goes below zero
  adding = math.max(adding, 0 - tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0'))
  if adding == 0 then adding = 0 end  -- never Lua's -0: HINCRBY refuses "-0"
end
local moved = 0
if adding > 0 and ARGV[8] ~= '' and redis.call('ZSCORE', KEYS[1], ARGV[8]) then
  moved = math.min(adding, tonumber(redis.call('HGET', KEYS[2], ARGV[8]) or '0'))
end
local used = 0 - moved
for _, held in ipairs(redis.call('HVALS', KEYS[2])) do used = used + tonumber(held) end
if tonumber(ARGV[3]) >= 0 then
  local holders = redis.call('ZCARD', KEYS[1])
  if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and holders >= tonumber(ARGV[4]) then
    return {-2, holders}
  end
  if used + adding > tonumber(ARGV[3]) then return {-1, used} end
end
if moved > 0 then redis.call('HINCRBY', KEYS[2], ARGV[8], 0 - moved) end
redis.call('HINCRBY', KEYS[2], ARGV[1], adding)
redis.call('ZADD', KEYS[1], ARGV[6], ARGV[1])
for _, key in ipairs(KEYS) do
  if redis.call('TTL', key) < tonumber(ARGV[7]) then redis.call('EXPIRE', key, ARGV[7]) end
end
return {0, used + adding}
"""


# Gives back a holder's bytes once per mark: each mark's bit is set, and the bytes of those
# newly set are given back (down to zero at most), in one step, so a pass that dies between
# the two never leaves a mark whose bytes stay held, and two passes never give one back twice.
# KEYS: holds (zset), bytes (hash), marks (bitmap, in the holds' slot). ARGV: holder, the
# marks' TTL, then pairs of (mark, bytes). Returns the bytes given back.
GIVE_BACK_ONCE_SCRIPT = """
local giving = 0
for i = 3, #ARGV, 2 do
  if redis.call('SETBIT', KEYS[3], ARGV[i], 1) == 0 then giving = giving + tonumber(ARGV[i + 1]) end
end
redis.call('EXPIRE', KEYS[3], ARGV[2])
if giving == 0 or not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
giving = math.min(giving, tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0'))
if giving > 0 then redis.call('HINCRBY', KEYS[2], ARGV[1], 0 - giving) end
return giving
"""


class QuotaFull(Exception):
    """A hold was refused: ``kind`` is ``bytes`` (no room) or ``count`` (too many holders);
    ``used`` the tenant's bytes, or holders, at that moment."""

    def __init__(self, kind: str, used: int):
        super().__init__(f"{kind} quota full at {used}")
        self.kind = kind
        self.used = used


class HeldQuota:
    """One tenant's holds against a per-key quota (``HOLD_SCRIPT``): bytes are held before
    they are written, by one script, so concurrent writers never both take the last room; a
    hold lapses at its time (a file's expiry, a dead upload's lease) without anyone's help."""

    def __init__(
        self, client: redis.Redis, held: str, held_bytes: str, max_bytes: int, max_holders: int
    ):
        self.redis = client
        self.keys = [held, held_bytes]
        self.max_bytes = max_bytes
        self.max_holders = max_holders
        self._script = client.register_script(HOLD_SCRIPT)
        self._give_back_once = client.register_script(GIVE_BACK_ONCE_SCRIPT)

    def hold(
        self,
        holder: str,
        adding: int,
        lapses_at: float,
        enforce: bool = True,
        drawing_from: str = "",
    ) -> int:
        """Adds ``adding`` bytes to ``holder``'s hold (negative: gives them back, never below
        zero), renewed to ``lapses_at``; raises
        QuotaFull past the quota unless ``enforce`` is False (bytes that must be kept, such as
        a batch's output, still count). With ``drawing_from``, that holder's bytes move over
        first, in the same step (a batch's output room to the files written from it: nobody
        can take the room between). Returns the bytes held in all (-1 when nothing was added
        to an absent holder: it is left absent)."""
        now = time.time()
        ttl = max(1, int(lapses_at - now) + 1)
        limit = self.max_bytes if enforce else -1
        status, used = self._script(
            keys=self.keys,
            args=[holder, adding, limit, self.max_holders, now, lapses_at, ttl, drawing_from],
        )
        if int(status) == -1:
            raise QuotaFull("bytes", int(used))
        if int(status) == -2:
            raise QuotaFull("count", int(used))
        return int(used)

    def give_back_once(
        self, holder: str, marks: str, giving: dict[int, int], ttl_seconds: int
    ) -> int:
        """Gives back ``giving``'s bytes (mark -> bytes) from ``holder``'s hold, each only if
        its mark in the bitmap ``marks`` (the holds' slot) was not set yet, which it sets, in
        one script call; returns the bytes given back."""
        if not giving:
            return 0
        pairs = [value for mark, giving_bytes in giving.items() for value in (mark, giving_bytes)]
        given = self._give_back_once(
            keys=[*self.keys, marks], args=[holder, max(1, ttl_seconds), *pairs]
        )
        return int(given)

    def keep(self, pipe: Any, holder: str, lapses_at: float) -> None:
        """Renews ``holder``'s hold to ``lapses_at`` on ``pipe``: what it pays for is kept
        until then (a file committed: its expiry, the longest any hold of the tenant lasts)."""
        pipe.zadd(self.keys[0], {holder: lapses_at}, xx=True)
        for key in self.keys:
            pipe.expire(key, max(1, int(lapses_at - time.time()) + 1))

    def release(self, holder: str, pipe: Any = None) -> None:
        target = pipe if pipe is not None else self.redis.pipeline(transaction=False)
        target.zrem(self.keys[0], holder)
        target.hdel(self.keys[1], holder)
        if pipe is None:
            target.execute()

    def first_lapse(self) -> float | None:
        """When the earliest hold lapses (room comes back), None without one."""
        first = self.redis.zrange(self.keys[0], 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    def lapse_times(self) -> dict[str, float]:
        """Each hold not lapsed yet, and when it lapses (its room comes back then)."""
        now = time.time()
        held: list[Any] = list(self.redis.zrangebyscore(self.keys[0], now, "+inf", withscores=True))
        return {str(holder): float(at) for holder, at in held}

    def used(self) -> int:
        """The bytes held now by holds not lapsed."""
        held: list[Any] = list(self.redis.zrangebyscore(self.keys[0], time.time(), "+inf"))
        if not held:
            return 0
        values = self.redis.hmget(self.keys[1], held)
        return sum(int(value) for value in values if value is not None)
