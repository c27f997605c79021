"""A configuration written before the tuning tables still runs a real stack, for one release.

`trickle up` with tuning knobs at their former places (``[web]``, ``[worker]``, directly in
``[models.demo]``, and a former environment name) serves jobs with those values, and each
process that loads the file logs one warning per former key, naming the key that replaces it.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests.clients import poll_until_finished, submit
from tests.upstack import start_up

FORMER = {
    "web.stream_flush_interval_ms": "tuning.stream_flush_interval_ms",
    "worker.publish_interval_ms": "tuning.publish_interval_ms",
    "models.demo.max_batch_wait_ms": "models.demo.tuning.max_batch_wait_ms",
    "TRICKLE__MODELS__DEMO__OVERFLOW_LANES": "TRICKLE__MODELS__DEMO__TUNING__OVERFLOW_LANES",
}


def test_former_key_names_still_run_a_stack_and_each_is_named_once(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    up = start_up(
        tmp_path,
        # Under start_up's [web] table: the former place of a web knob.
        "stream_flush_interval_ms = 5.0\n"
        "[worker]\npublish_interval_ms = 10.0\n"
        f'[models.demo]\npath = "{demo_model_dir}"\nmax_batch_wait_ms = 3.0\n',
        env={"TRICKLE__MODELS__DEMO__OVERFLOW_LANES": "1"},
    )
    try:
        job = submit(up.base, {"prompt": "The", "max_tokens": 8, "temperature": 0})
        assert poll_until_finished(up.base, job["id"], timeout=60)["status"] == "succeeded"
        log = up.log()
    finally:
        up.stop()
    for old, new in FORMER.items():
        warning = f"{old} is deprecated and will be removed; set {new} instead"
        per_process = Counter(source(line) for line in log.splitlines() if warning in line)
        # One per key and per load: the launcher, the worker, and gunicorn's master (its bind
        # and worker count) and its one worker process, both shown as web.1.
        assert per_process == {"launcher": 1, "worker.1": 1, "web.1": 2}, (old, per_process)


def source(line: str) -> str:
    """Which process wrote a line of `trickle up`'s output: the supervisor prefixes a child's
    lines with a time and its name (``12:00:00 web.1 | ...``); the launcher's own have none."""
    prefixed = re.match(r"\S+ (\S+)\s+\| ", line)
    return prefixed.group(1) if prefixed else "launcher"
