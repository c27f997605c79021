"""Shared prompt prefixes: a system prompt that many chats start with is prefilled once.

CTranslate2's ``generate_batch(static_prompt=..., cache_static_prompt=True)`` keeps the decoder
state after a static prompt and starts every later batch with the same prompt from a copy of
it, so those batches skip the prefix's forward pass. A static prompt is the whole batch's, so
a batch holds jobs of one prefix only (``policy.batches_with``).

Which prefix a prompt has is decided here, on token ids (so the ids the engine sees are the
prompt's own, and greedy output cannot change):

- **configured** (``static_prompts``): each text is encoded as a prompt is (start token
  included); its last few ids are dropped, since a tokenizer may merge the prefix's end with
  the text that follows it, and what remains is the prefix of every prompt that starts with it;
- **learned**: a prompt that shares at least ``prefix_min_tokens`` leading ids with a recent
  prompt makes their common part (less the same margin) a prefix.

Partitions: a cached prefix makes its tenant's next prompt fast, which another caller could time
to learn what someone else recently sent. So learned prefixes belong to a partition, the
submitting API key's by default (``cache_partition``), or a ``cache_salt`` the request names
(vLLM's field: every key that sends the same salt shares): a prompt only finds prefixes learned
in its own partition, and the engine never lets a partition's first batch with a prefix start
from a state that another partition cached (worker/engine/engine.py). Configured prefixes
are the operator's and shared by all (``SHARED``).

Memory and eviction: CTranslate2 keeps each cached state (per layer, keys and values of every
prefix token: 2 x layers x tokens x d_model values, float32 on a CPU, float16 on a GPU; about
41 MB for 1,250 tokens of the bench model, d_model 512 x 8 layers) for the life of the loaded
model, shared by the lanes on one device, and has no call to drop one. The table is bounded
and least-recently-used first out: at most ``prefix_cache_entries`` learned prefixes holding at
most ``prefix_cache_tokens`` tokens (configured ones always); a new common prefix evicts the
ones used longest ago. The engine bounds what CTranslate2 itself holds by the same token budget
(worker/engine/prefix_cache.py): an evicted prefix's state stays there until the engine process
is recycled, which the engine does when a new prefix needs the room and no batch runs. A new
engine process starts with CTranslate2's cache empty, and the first batch of each prefix fills
it again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trickle.config.sections import ModelSettings
from trickle.tokenization import Tokenizer

# Ids dropped from a configured prefix's end: where its text meets the next, the tokenizer may
# choose other pieces than for the text alone.
BOUNDARY_MARGIN = 4
RECENT_PROMPTS = 64  # prompts a new one is compared with, to learn a common prefix
SHARED = ""  # the partition of configured prefixes: every caller's


def cache_partition(tenant_digest: str, cache_salt: str = "") -> str:
    """Whose cached prefixes a job may find: those of its ``cache_salt`` (any key that sends
    the same salt), else its tenant's (``tenant_digest``; anonymous callers share)."""
    return f"salt:{cache_salt}" if cache_salt else f"key:{tenant_digest}"


@dataclass(frozen=True)
class PrefixMatch:
    """A prompt's shared prefix and the partition it belongs to (``SHARED`` when configured)."""

    prefix: tuple[int, ...] = ()
    partition: str = SHARED


NO_PREFIX = PrefixMatch()


class PrefixTable:
    """The shared prefix (if any) each prompt starts with; one per model, under the scheduler's
    lock. Prompts and prefixes are compared by their first ``min_tokens`` ids first, so a
    lookup costs a dictionary probe and a few slice comparisons, not a scan."""

    def __init__(
        self,
        configured: Iterable[Sequence[int]],
        max_entries: int,
        min_tokens: int,
        max_tokens: int = 0,
    ) -> None:
        """``max_tokens``: the most tokens the learned prefixes may hold together (0: only
        ``max_entries`` bounds them)."""
        self._max_learned = max_entries
        self._max_tokens = max_tokens
        self._min = max(min_tokens, 1)
        self._configured: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        # Learned prefixes by (partition, prefix), least recently used first.
        self._learned: OrderedDict[tuple[str, tuple[int, ...]], None] = OrderedDict()
        self._learned_by_head: dict[tuple[str, tuple[int, ...]], list[tuple[int, ...]]] = {}
        self._learned_tokens = 0
        self._evicted: list[tuple[int, ...]] = []  # no longer learned anywhere: take_evicted
        self._recent: dict[tuple[str, tuple[int, ...]], deque[tuple[int, ...]]] = {}
        self._recent_order: deque[tuple[str, tuple[int, ...]]] = deque()
        for ids in configured:
            prefix = tuple(ids[: len(ids) - BOUNDARY_MARGIN])
            if len(prefix) >= self._min:
                group = self._configured.setdefault(prefix[: self._min], [])
                if prefix not in group:
                    group.append(prefix)

    @classmethod
    def for_model(cls, model: ModelSettings, tokenizer: Tokenizer) -> PrefixTable:
        """The model's configured static prompts, encoded as its prompts are, and its limits.
        ``prefix_cache_entries = 0`` turns sharing off, configured prompts included."""
        if model.prefix_cache_entries == 0:
            return cls((), 0, model.prefix_min_tokens)
        configured = [tokenizer.encode(text) for text in model.static_prompts]
        return cls(
            configured,
            model.prefix_cache_entries,
            model.prefix_min_tokens,
            model.prefix_cache_tokens,
        )

    @property
    def enabled(self) -> bool:
        return bool(self._configured) or self._max_learned > 0

    def entries(self) -> list[tuple[int, ...]]:
        """Every prefix: the configured ones, then the learned ones from least recently used."""
        configured = [prefix for group in self._configured.values() for prefix in group]
        return configured + [prefix for _, prefix in self._learned]

    def learned_tokens(self) -> int:
        return self._learned_tokens

    def take_evicted(self) -> list[tuple[int, ...]]:
        """The prefixes evicted since the last call that no partition has learned again and
        none is configured: their cached state is dead weight (``Engine.forget_prefix``)."""
        if not self._evicted:
            return []
        evicted, self._evicted = self._evicted, []
        configured = {prefix for group in self._configured.values() for prefix in group}
        learned = {prefix for _, prefix in self._learned}
        return [prefix for prefix in evicted if prefix not in learned and prefix not in configured]

    def prefix_for(self, prompt_ids: Sequence[int], partition: str = SHARED) -> tuple[int, ...]:
        """``match`` for callers that need only the prefix."""
        return self.match(prompt_ids, partition).prefix

    def match(self, prompt_ids: Sequence[int], partition: str = SHARED) -> PrefixMatch:
        """The longest known prefix of ``prompt_ids`` that ``partition`` may use (at least one
        id is left after it, the engine's start token); else a prefix learned from a recent
        prompt of the same partition; else none."""
        if not self.enabled or len(prompt_ids) <= self._min:
            return NO_PREFIX
        prompt = tuple(prompt_ids)
        head = prompt[: self._min]
        best = NO_PREFIX
        for where, group in (
            (SHARED, self._configured.get(head, ())),
            (partition, self._learned_by_head.get((partition, head), ())),
        ):
            for prefix in group:
                if len(best.prefix) < len(prefix) < len(prompt) and prompt[: len(prefix)] == prefix:
                    best = PrefixMatch(prefix, where)
        if best.prefix:
            if (best.partition, best.prefix) in self._learned:
                self._learned.move_to_end((best.partition, best.prefix))
            return best
        learned = self._learn(prompt, head, partition)
        self._remember(prompt, head, partition)
        return PrefixMatch(learned, partition) if learned else NO_PREFIX

    def _learn(
        self, prompt: tuple[int, ...], head: tuple[int, ...], partition: str
    ) -> tuple[int, ...]:
        if self._max_learned <= 0:
            return ()
        common = max(
            (_common_length(prompt, other) for other in self._recent.get((partition, head), ())),
            default=0,
        )
        # Less a margin, as for configured prompts: the ids just past a shared system prompt
        # (the first piece of the user's turn) are shared by chance, and a prefix that ends
        # there would miss the next chat that starts otherwise.
        common = min(common - BOUNDARY_MARGIN, len(prompt) - 1)
        if common < self._min or (self._max_tokens and common > self._max_tokens):
            return ()
        prefix = prompt[:common]
        self._learned[partition, prefix] = None
        self._learned_by_head.setdefault((partition, head), []).append(prefix)
        self._learned_tokens += len(prefix)
        self._evict()
        return prefix

    def _evict(self) -> None:
        """Drop the least recently used learned prefixes until both bounds hold."""
        while len(self._learned) > self._max_learned or (
            self._max_tokens and self._learned_tokens > self._max_tokens
        ):
            (partition, prefix), _ = self._learned.popitem(last=False)
            where = (partition, prefix[: self._min])
            group = self._learned_by_head[where]
            group.remove(prefix)
            if not group:
                del self._learned_by_head[where]
            self._learned_tokens -= len(prefix)
            self._evicted.append(prefix)

    def _remember(self, prompt: tuple[int, ...], head: tuple[int, ...], partition: str) -> None:
        where = (partition, head)
        self._recent.setdefault(where, deque()).append(prompt)
        self._recent_order.append(where)
        if len(self._recent_order) > RECENT_PROMPTS:
            oldest = self._recent_order.popleft()
            group = self._recent[oldest]
            group.popleft()
            if not group:
                del self._recent[oldest]


def _common_length(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common leading part of ``a`` and ``b`` (slice comparisons, in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
