"""Several jobs' followers at once (an ``n`` > 1 request, a multi-prompt completion): opened
all or none, and their events interleaved as they arrive, one reader thread per job."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator

from trickle.store.job_store import JobStore
from trickle.waiting_reader import WaitEstimator
from web.streams.follow import FollowEvent, JobFollower, KeepAlive
from web.streams.hub import TokenHub


def open_followers(
    store: JobStore,
    hub: TokenHub,
    job_ids: list[str],
    tenant_digest: str = "",
    statuses: bool = True,
    waiting: WaitEstimator | None = None,
) -> list[JobFollower]:
    """A follower per job from the start, or none at all: a failure closes those opened."""
    followers: list[JobFollower] = []
    try:
        for job_id in job_ids:
            followers.append(JobFollower(store, hub, job_id, -1, tenant_digest, statuses, waiting))
    except BaseException:
        close_all(followers)
        raise
    return followers


def close_all(followers: list[JobFollower]) -> None:
    for follower in followers:
        follower.close()


def follow_many(
    followers: list[JobFollower],
    keepalive_seconds: float,
    pace: Callable[[], float] = lambda: 0.0,
) -> Generator[list[tuple[int, FollowEvent]], None, None]:
    """Interleave several jobs' events as they arrive, tagged with the follower's position and
    grouped by wake-up (everything that arrived meanwhile), so a caller writes once per group,
    not once per token; ``pace`` as in ``JobFollower.chunks``.

    One reader thread per job (a greenlet under gevent) feeds a shared queue; closing this
    generator stops them all after their current wait.
    """
    if len(followers) == 1:
        chunks = followers[0].chunks(keepalive_seconds, pace)
        try:
            for chunk in chunks:
                yield [(0, event) for event in chunk]
        finally:
            chunks.close()
        return
    merged: queue.SimpleQueue[tuple[int, FollowEvent | None]] = queue.SimpleQueue()
    stop = threading.Event()

    def pump(position: int, follower: JobFollower) -> None:
        chunks = follower.chunks(keepalive_seconds, pace)
        try:
            for chunk in chunks:
                if stop.is_set():
                    return
                for event in chunk:
                    if not isinstance(event, KeepAlive):
                        merged.put((position, event))
        finally:
            chunks.close()
            merged.put((position, None))

    threads = [
        threading.Thread(target=pump, args=(i, f), daemon=True) for i, f in enumerate(followers)
    ]
    for thread in threads:
        thread.start()
    running = len(threads)
    try:
        while running:
            try:
                first = merged.get(timeout=keepalive_seconds)
            except queue.Empty:
                yield [(-1, KeepAlive())]
                continue
            group: list[tuple[int, FollowEvent]] = []
            item: tuple[int, FollowEvent | None] | None = first
            while item is not None:
                position, event = item
                if event is None:
                    running -= 1
                else:
                    group.append((position, event))
                try:
                    item = merged.get_nowait()
                except queue.Empty:
                    item = None
            if group:
                yield group
    finally:
        stop.set()
        close_all(followers)  # the count drops now; each pump ends at its next wake-up
