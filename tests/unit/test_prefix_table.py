"""The shared-prefix table's eviction (least recently used, bounded in entries and in tokens)
and its partitions (an API key's learned prefixes are its own unless a cache_salt is shared),
and the engine's rule for CTranslate2's cache (no partition starts from another's state)."""

from __future__ import annotations

from worker.engine.prefix import (
    BOUNDARY_MARGIN,
    SHARED,
    PrefixMatch,
    PrefixTable,
    cache_partition,
)
from worker.engine.prefix_cache import PrefixCacheState

A, B = cache_partition("digest-a"), cache_partition("digest-b")


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def learn(table: PrefixTable, opening: list[int], partition: str = A) -> tuple[int, ...]:
    """Two prompts that share ``opening``: the second one learns it (less the margin)."""
    table.prefix_for([*opening, 1], partition)
    learned = table.prefix_for([*opening, 2], partition)
    assert learned == tuple(opening[: len(opening) - BOUNDARY_MARGIN])
    return learned


def test_a_new_prefix_evicts_the_least_recently_used_one() -> None:
    table = PrefixTable((), max_entries=2, min_tokens=8)
    first, second = learn(table, ids(20, 100)), learn(table, ids(20, 200))
    assert table.prefix_for([*ids(20, 100), 3], A) == first  # a hit makes it the most recent
    third = learn(table, ids(20, 300))
    assert table.entries() == [first, third]  # the second was used longest ago
    assert second not in table.entries()


def test_the_learned_prefixes_are_bounded_in_tokens() -> None:
    table = PrefixTable((), max_entries=8, min_tokens=8, max_tokens=40)
    first = learn(table, ids(20, 100))
    second = learn(table, ids(20, 200))
    assert table.learned_tokens() == len(first) + len(second) <= 40
    third = learn(table, ids(20, 300))  # 3 x 16 tokens > 40: the oldest goes
    assert table.entries() == [second, third] and table.learned_tokens() <= 40
    # A prefix longer than the whole budget is never learned (it would evict everything).
    long = ids(60, 1000)
    table.prefix_for([*long, 1], A)
    assert table.prefix_for([*long, 2], A) == ()
    assert table.entries() == [second, third]


def test_configured_prefixes_are_always_kept_and_shared() -> None:
    configured = ids(30, 500)
    table = PrefixTable([configured], max_entries=1, min_tokens=8)
    kept = tuple(configured[: len(configured) - BOUNDARY_MARGIN])
    for start in (1000, 2000, 3000):
        learn(table, ids(20, start))
    assert table.entries()[0] == kept and len(table.entries()) == 2
    assert table.match([*configured, 7], B) == PrefixMatch(kept, SHARED)
    assert PrefixTable((), 0, 8).prefix_for([*configured, 7]) == ()  # 0: sharing is off


def test_another_keys_prompt_never_finds_nor_teaches_a_keys_prefix() -> None:
    table = PrefixTable((), max_entries=4, min_tokens=8)
    opening = ids(20, 100)
    learned = learn(table, opening, A)
    assert table.match([*opening, 5], A) == PrefixMatch(learned, A)
    # Key B sends the same opening: it finds nothing of A's...
    assert table.prefix_for([*opening, 5], B) == ()
    # ...and A's recent prompts do not make B's a common prefix either: B learns from its own.
    other = ids(20, 700)
    table.prefix_for([*other, 1], A)
    assert table.prefix_for([*other, 2], B) == ()
    assert table.match([*opening, 6], B) == PrefixMatch(learned, B)  # B's own, learned now


def test_a_shared_cache_salt_shares_across_keys() -> None:
    assert cache_partition("digest-a", "team") == cache_partition("digest-b", "team")
    assert cache_partition("digest-a", "team") != cache_partition("digest-a")
    table = PrefixTable((), max_entries=4, min_tokens=8)
    salted = cache_partition("digest-a", "team")
    learned = learn(table, ids(20, 100), salted)
    assert table.prefix_for([*ids(20, 100), 9], cache_partition("digest-b", "team")) == learned
    assert table.prefix_for([*ids(20, 100), 9], cache_partition("digest-b", "other")) == ()


def test_no_partition_starts_from_another_partitions_cached_state() -> None:
    state = PrefixCacheState(max_tokens=100)
    prefix = tuple(ids(40))
    assert state.may_use(A, prefix)  # nothing held: A computes it and CTranslate2 saves it
    state.ran(A, prefix, cached=True)
    assert state.warm(A, prefix) and state.may_use(A, prefix)
    # B's first batch with the same ids computes them (a miss, like any new prefix)...
    assert not state.warm(B, prefix) and not state.may_use(B, prefix)
    state.ran(B, prefix, cached=False)
    # ...after which B has sent it itself, and may start from the cached state.
    assert state.warm(B, prefix) and state.may_use(B, prefix)
    assert state.held_tokens == 40


def test_cached_states_are_bounded_in_tokens_but_configured_prompts_always_fit() -> None:
    state = PrefixCacheState(max_tokens=100)
    state.ran(A, tuple(ids(60)), cached=True)
    big = tuple(ids(60, 100))
    assert not state.may_use(A, big)  # 120 > 100: computed per batch, never saved
    state.ran(A, big, cached=False)
    assert not state.warm(A, big) and state.held_tokens == 60
    assert state.may_use(SHARED, big)  # a configured prompt is always cached
    assert state.emptied().held_tokens == 0  # a new engine process starts empty


def test_the_table_reports_what_no_partition_has_learned_any_more() -> None:
    table = PrefixTable((), max_entries=2, min_tokens=8)
    opening = ids(20, 100)
    kept_by_b = learn(table, opening, B)
    first = learn(table, opening, A)  # the same ids for A
    assert table.take_evicted() == []
    learn(table, ids(20, 200))  # evicts B's entry: A still has those ids
    assert table.take_evicted() == []
    learn(table, ids(20, 300))  # evicts A's: nobody has them now
    assert table.take_evicted() == [first] == [kept_by_b]
    assert table.take_evicted() == []  # reported once


def test_a_recycle_is_wanted_only_when_evicted_prefixes_hold_the_room() -> None:
    state = PrefixCacheState(max_tokens=100)
    old, new = tuple(ids(60)), tuple(ids(60, 100))
    state.ran(A, old, cached=True)
    assert not state.may_use(A, new) and not state.wants_recycle(A, new)  # old is in use
    state.forget(old)
    assert not state.may_use(A, new) and state.wants_recycle(A, new)
    assert not state.wants_recycle(SHARED, new)  # configured prompts are cached anyway
    state.ran(A, old, cached=False)  # learned again and used: no longer dead weight
    assert not state.wants_recycle(A, new)
