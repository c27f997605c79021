"""What CTranslate2's static-prompt cache holds in one engine process, and who may use it.

CTranslate2 saves the state after a static prompt on the first batch that passes
``cache_static_prompt=True`` and starts every later such batch with the same prompt from it;
it never drops one. Two rules follow, both decided per batch here (worker/engine/prefix.py
decides which prefix a prompt has):

- **No timing across partitions.** A batch starts from a cached state only if its own
  partition (API key or ``cache_salt``) ran that prefix before; the first batch of another
  partition computes it (``cache_static_prompt=False``), so its time to first token is a miss
  whatever someone else sent. From then on that partition hits too: it sent the prefix itself.
- **A memory budget.** New states are saved while the prefixes held total at most
  ``prefix_cache_tokens`` tokens (configured prompts always); past it a new prefix is computed
  per batch. Only a new engine process empties CTranslate2's cache (``emptied``): when the
  table has evicted enough of what is held (``forget``) that the new prefix would fit without
  them, the engine recycles its process at the next moment no batch runs
  (``wants_recycle``), so the budget holds and new prefixes are cached again.
"""

from __future__ import annotations

from collections import OrderedDict

from worker.engine.prefix import SHARED

# (partition, prefix) pairs remembered as warm: callers choose salts freely, so the set is
# bounded; forgetting one only costs that partition one more computed prefix.
MAX_WARM = 4096


class PrefixCacheState:
    """Kept by the engine, under its lock."""

    def __init__(self, max_tokens: int) -> None:
        self._max_tokens = max_tokens
        self._held: set[tuple[int, ...]] = set()
        self._held_tokens = 0
        # Held, but evicted from the prefix table: memory only a recycle gives back.
        self._dead: set[tuple[int, ...]] = set()
        self._dead_tokens = 0
        self._warm: OrderedDict[tuple[str, tuple[int, ...]], None] = OrderedDict()

    def emptied(self) -> PrefixCacheState:
        """The state of a new engine process: nothing cached, the same budget."""
        return PrefixCacheState(self._max_tokens)

    @property
    def held_tokens(self) -> int:
        return self._held_tokens

    def warm(self, partition: str, prefix: tuple[int, ...]) -> bool:
        """Whether ``partition``'s next batch with ``prefix`` starts from the cached state."""
        return (partition, prefix) in self._warm

    def may_use(self, partition: str, prefix: tuple[int, ...]) -> bool:
        """``cache_static_prompt`` for a batch of ``partition`` with ``prefix``."""
        if (partition, prefix) in self._warm:
            return True
        if prefix in self._held:
            return False  # another partition's state: compute this partition's first batch
        within = not self._max_tokens or self._held_tokens + len(prefix) <= self._max_tokens
        return partition == SHARED or within

    def forget(self, prefix: tuple[int, ...]) -> None:
        """The prefix table no longer has ``prefix`` (for any partition)."""
        if prefix in self._held and prefix not in self._dead:
            self._dead.add(prefix)
            self._dead_tokens += len(prefix)

    def wants_recycle(self, partition: str, prefix: tuple[int, ...]) -> bool:
        """Whether ``prefix`` was refused a cached state for want of room that only evicted
        prefixes take: a new engine process would have it."""
        if not self._max_tokens or partition == SHARED or prefix in self._held:
            return False
        needed = len(prefix)
        return (
            self._held_tokens + needed > self._max_tokens
            and self._held_tokens - self._dead_tokens + needed <= self._max_tokens
        )

    def ran(self, partition: str, prefix: tuple[int, ...], cached: bool) -> None:
        """A batch of ``partition`` with ``prefix`` ended; ``cached``: it passed
        ``cache_static_prompt=True`` (CTranslate2 now holds the state)."""
        if cached and prefix not in self._held:
            self._held.add(prefix)
            self._held_tokens += len(prefix)
        if prefix in self._dead:  # learned again: in use, no longer dead weight
            self._dead.discard(prefix)
            self._dead_tokens -= len(prefix)
        if prefix in self._held:
            self._warm[partition, prefix] = None
            self._warm.move_to_end((partition, prefix))
            if len(self._warm) > MAX_WARM:
                self._warm.popitem(last=False)
