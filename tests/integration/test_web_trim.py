"""The web process gives free heap back on gevent's pool of OS threads (web/gunicorn_conf.py);
a subprocess, so that ``monkey.patch_all()`` patches that process, not the test run."""

from __future__ import annotations

import subprocess
import sys


def test_the_web_trims_on_a_gevent_pool_thread() -> None:
    """The web's trim runs on gevent's pool of OS threads, after ``monkey.patch_all()``: there
    ``ctypes.util.find_library`` (an ``ldconfig`` subprocess) raised, and the trim thread died."""
    code = (
        "from gevent import monkey; monkey.patch_all()\n"
        "from gevent import get_hub\n"
        "from trickle.heap import trim_freed_memory\n"
        "print(type(get_hub().threadpool.apply(trim_freed_memory)).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "bool"
