"""Batch jobs accepted but not yet on the broker, for the key's queue cap a batch's reading
honours (``web.batches.key_room.KeyRoom``).

The broker counts the batch jobs that wait (``QueueReader.depth`` at batch priority), but a
group's task messages are sent in the background after it is recorded (about a second per
10,000 jobs, ``submission.enqueue_many``), so groups read within that second would each find
the old count and pass. So each batch consumer process also counts the batch jobs it has
accepted whose messages are not all sent yet (``PendingBatchJobs``), and a group reserves its
jobs there in the same step that checks the cap: two readings of one process never both take
the last places. Several consumers can overshoot the cap only by what the others accept
within one fan-out. The reservation ends when the messages are sent, or when the group fails
before anything was created.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping


class Reservation:
    """Places one batch holds until its messages are sent; ``release`` is idempotent."""

    def __init__(self, pending: PendingBatchJobs, counts: Mapping[tuple[str, str], int]):
        self._pending = pending
        self._counts = dict(counts)

    def release(self) -> None:
        counts, self._counts = self._counts, {}
        self._pending.remove(counts)

    def hand_over(self) -> Callable[[], None]:
        """The places move to whoever calls the returned function (the fan-out, once every
        message is sent); this reservation then holds none."""
        counts, self._counts = self._counts, {}
        return Reservation(self._pending, counts).release


class PendingBatchJobs:
    """Per (model, tenant): batch jobs accepted here whose task messages are not all sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: Counter[tuple[str, str]] = Counter()

    def reserve_within(
        self, tenant: str, adding: Mapping[str, int], waiting: Mapping[str, int], limit: int
    ) -> Reservation | str:
        """Reserve ``adding`` jobs per model if each model's ``waiting`` (the broker's count)
        plus what is pending here stays within ``limit``; else the first model that would not."""
        with self._lock:
            for model, count in adding.items():
                if waiting[model] + self._pending[model, tenant] + count > limit:
                    return model
            counts = {(model, tenant): count for model, count in adding.items()}
            self._pending.update(counts)
        return Reservation(self, counts)

    def remove(self, counts: Mapping[tuple[str, str], int]) -> None:
        with self._lock:
            self._pending.subtract(counts)
            for where in [where for where, count in self._pending.items() if count <= 0]:
                del self._pending[where]
