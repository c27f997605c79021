"""The engine process dies with its worker, however the worker dies.

A closed pipe already ends the engine's lanes when the worker goes, but only when every copy
of the worker's pipe ends is closed and no lane is stuck mid-batch; a SIGKILLed worker has left
engines of ~130 MB running for hours. ``PR_SET_PDEATHSIG`` would signal the engine when the
*thread* that spawned it exits, and the worker restarts engines from whichever job thread needs
one, so a thread here polls for the one fact that holds however the parent went: the engine
has been reparented (``getppid`` no longer names the worker).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time

log = logging.getLogger(__name__)

PARENT_POLL_SECONDS = 0.5


def exit_with_parent(poll_seconds: float = PARENT_POLL_SECONDS) -> threading.Thread:
    """Start a daemon thread that ends this process at once when its parent is gone."""
    parent = multiprocessing.parent_process()
    expected = parent.pid if parent is not None and parent.pid else os.getppid()

    def watch() -> None:
        while os.getppid() == expected:
            time.sleep(poll_seconds)
        log.warning("the worker (pid %d) is gone: the engine process exits", expected)
        os._exit(0)  # no teardown: a Generator freed mid-batch can abort the process

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread
