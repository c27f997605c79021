"""Settles batches without waiting for a read: a batch whose requests have all finished, or
whose window is over, gets its output and error files and its final stage (``settle``, as
``GET /v1/batches/<id>`` does), so a client that only waits for ``output_file_id`` or lists
its files finds them, and an expired batch's unfinished jobs stop.

One thread per web process (a greenlet under gunicorn's gevent workers, whose ``threading``
is patched) wakes every ``files.batch_sweep_seconds``. A Redis lock with that lifetime lets one
process sweep per turn, and ``finalize``'s own lease keeps two processes from writing one
batch's files should two sweeps (or a sweep and a read) meet.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from trickle import keys
from web.batches.finalize import batch_store, settle
from web.batches.store import FINAL_STAGES
from web.services import Services

log = logging.getLogger(__name__)


class BatchSweeper:
    def __init__(self, svc: Services):
        self._svc = svc
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        interval = self._svc.settings.files.batch_sweep_seconds
        if interval <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, args=(interval,), name="trickle-batch-sweeper", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                sweep(self._svc, interval)
            except redis.RedisError as exc:  # Redis away: the next turn tries again
                log.warning("batch sweep skipped: redis unavailable: %s", exc)
            except Exception:  # one bad batch must not end the sweeps of every other
                log.exception("batch sweep failed")


def sweep(svc: Services, interval: float) -> int:
    """Settles every unsettled batch that is due; returns how many reached a final stage
    (0 when another process holds this turn)."""
    if not svc.redis.set(keys.batch_sweep(), "1", nx=True, px=max(int(interval * 1000), 1)):
        return 0
    store = batch_store(svc)
    settled = 0
    for batch_id in store.unsettled():
        batch = store.record(batch_id)
        if batch is None or batch.stage in FINAL_STAGES:
            store.settled(batch_id)  # expired, or ended by a read or at validation
            continue
        found, _tally = settle(svc, store, batch)
        settled += found.stage in FINAL_STAGES
        time.sleep(0)  # under gevent: the process's requests run between batches
    return settled
