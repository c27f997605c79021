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

Memory and eviction: CTranslate2 keeps each cached state (per layer, keys and values of every
prefix token: 2 x layers x tokens x d_model values, float32 on a CPU, float16 on a GPU; about
41 MB for 1,250 tokens of the bench model, d_model 512 x 8 layers) for the life of the loaded
model, shared by the lanes on one device, and has no call to drop one. So the table is bounded
instead: at most ``prefix_cache_entries`` learned prefixes (configured ones always), first
come; once full, a new common prefix is not learned. The engine process's restart empties
CTranslate2's cache, and the first batch of each prefix then fills it again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from trickle.config.sections import ModelSettings
from trickle.tokenizer import Tokenizer

# Ids dropped from a configured prefix's end: where its text meets the next, the tokenizer may
# choose other pieces than for the text alone.
BOUNDARY_MARGIN = 4
RECENT_PROMPTS = 64  # prompts a new one is compared with, to learn a common prefix


class PrefixTable:
    """The shared prefix (if any) each prompt starts with; one per model, under the scheduler's
    lock. Prompts and prefixes are compared by their first ``min_tokens`` ids first, so a
    lookup costs a dictionary probe and a few slice comparisons, not a scan."""

    def __init__(
        self, configured: Iterable[Sequence[int]], max_entries: int, min_tokens: int
    ) -> None:
        self._max_learned = max_entries
        self._min = max(min_tokens, 1)
        self._learned = 0
        self._entries: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self._recent: dict[tuple[int, ...], deque[tuple[int, ...]]] = {}
        self._recent_order: deque[tuple[int, ...]] = deque()
        for ids in configured:
            prefix = tuple(ids[: len(ids) - BOUNDARY_MARGIN])
            if len(prefix) >= self._min:
                self._add(prefix)

    @classmethod
    def for_model(cls, model: ModelSettings, tokenizer: Tokenizer) -> PrefixTable:
        """The model's configured static prompts, encoded as its prompts are, and its limits.
        ``prefix_cache_entries = 0`` turns sharing off, configured prompts included."""
        if model.prefix_cache_entries == 0:
            return cls((), 0, model.prefix_min_tokens)
        configured = [tokenizer.encode(text) for text in model.static_prompts]
        return cls(configured, model.prefix_cache_entries, model.prefix_min_tokens)

    @property
    def enabled(self) -> bool:
        return bool(self._entries) or self._max_learned > 0

    def entries(self) -> list[tuple[int, ...]]:
        return [prefix for group in self._entries.values() for prefix in group]

    def prefix_for(self, prompt_ids: Sequence[int]) -> tuple[int, ...]:
        """The longest known prefix of ``prompt_ids`` (at least one id is left after it, the
        engine's start token); else a prefix learned from a recent prompt; else ``()``."""
        if not self.enabled or len(prompt_ids) <= self._min:
            return ()
        prompt = tuple(prompt_ids)
        head = prompt[: self._min]
        known = [
            prefix
            for prefix in self._entries.get(head, ())
            if len(prefix) < len(prompt) and prompt[: len(prefix)] == prefix
        ]
        if known:
            return max(known, key=len)
        learned = self._learn(prompt, head)
        self._remember(prompt, head)
        return learned

    def _learn(self, prompt: tuple[int, ...], head: tuple[int, ...]) -> tuple[int, ...]:
        if self._learned >= self._max_learned:
            return ()
        common = max(
            (_common_length(prompt, other) for other in self._recent.get(head, ())), default=0
        )
        # Less a margin, as for configured prompts: the ids just past a shared system prompt
        # (the first piece of the user's turn) are shared by chance, and a prefix that ends
        # there would miss the next chat that starts otherwise.
        common = min(common - BOUNDARY_MARGIN, len(prompt) - 1)
        if common < self._min:
            return ()
        prefix = prompt[:common]
        self._add(prefix)
        self._learned += 1
        return prefix

    def _add(self, prefix: tuple[int, ...]) -> None:
        group = self._entries.setdefault(prefix[: self._min], [])
        if prefix not in group:
            group.append(prefix)

    def _remember(self, prompt: tuple[int, ...], head: tuple[int, ...]) -> None:
        self._recent.setdefault(head, deque()).append(prompt)
        self._recent_order.append(head)
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
