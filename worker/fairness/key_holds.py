"""How a worker holds a key back: its queues paused and resumed on Celery's consumer, and the
prefetch window widened by each message held, so another key's task is fetched meanwhile.

Used by the dispatcher (worker/dispatch.py) for a key over its ``max_running_jobs``, over its
share of this worker's slots (the reserve lane's), or ahead of its token share
(worker/fairness/vtc.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trickle.queue import TenantQueues


def _no_switch(_: str) -> None:
    pass


def _no_hold(_: int) -> None:
    pass


@dataclass
class QueueSwitches:
    """How a worker holds a key back: stop and start consuming its queues, and widen the
    prefetch window by the messages held (Celery's consumer does both: ``queue_switches``)."""

    pause: Callable[[str], None] = _no_switch
    resume: Callable[[str], None] = _no_switch
    hold: Callable[[int], None] = _no_hold  # prefetch window +count (negative: narrower)


def queue_switches(consumer: Any, queues: TenantQueues) -> QueueSwitches:
    """A held key's queues are paused and resumed on the consumer's own thread; each held
    message widens the prefetch window, as Celery's ETA tasks do.

    kombu's hub runs ``call_soon`` callbacks in no set order (they wait in a ``set``): a pause
    and the resume right after it, run resume first, left the key's queues paused with nothing
    held, and the key's backlog unread for good. So a callback does not say what to do: it
    brings the key's queues to the state wanted when it runs, whatever ran before it.
    """
    paused: set[str] = set()
    lock = threading.Lock()

    def settle(tenant: str) -> None:
        with lock:
            wanted_paused = tenant in paused
        for name in queues.of_key(tenant):
            consuming = consumer.task_consumer.consuming_from(name)
            if wanted_paused and consuming:
                consumer.cancel_task_queue(name)
            elif not wanted_paused and not consuming:
                consumer.add_task_queue(name)

    def pause(tenant: str) -> None:
        with lock:
            paused.add(tenant)
        consumer.call_soon(settle, tenant)

    def resume(tenant: str) -> None:
        with lock:
            paused.discard(tenant)
        consumer.call_soon(settle, tenant)

    def hold(count: int) -> None:
        if count > 0:
            consumer.qos.increment_eventually(count)
        elif count < 0:
            consumer.qos.decrement_eventually(-count)

    return QueueSwitches(pause, resume, hold)
