"""The supervisor on toy processes: restarts with backoff, a crash loop left stopped, the rest
untouched, and a stop that SIGKILLs what ignores SIGTERM. Real processes, no mocks."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from ops.supervisor import RespawnPolicy
from tests.stack import child_env
from tests.upstack import TRICKLE, alive
from trickle.config.settings import PROJECT_ROOT

PY = sys.executable


def test_backoff_doubles_up_to_its_ceiling() -> None:
    policy = RespawnPolicy(delay_seconds=0.5, max_delay_seconds=3.0)
    assert [policy.delay_after(n) for n in range(1, 7)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


def test_the_procfile_stays_valid_for_honcho() -> None:
    checked = subprocess.run(
        [PY, "-m", "honcho", "-f", str(PROJECT_ROOT / "Procfile"), "check"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr
    assert "web, worker" in checked.stderr


def test_a_crash_loop_stops_alone_and_a_stop_kills_what_ignores_sigterm(
    tmp_path: Path, redis_url: str
) -> None:
    procfile = tmp_path / "Procfile"
    procfile.write_text(
        f"steady: {PY} -c \"import os, time; print('port', os.environ['PORT'], flush=True); "
        'time.sleep(120)"\n'
        f"flaky: {PY} -c \"import sys; print('flaky up', flush=True); sys.exit(3)\"\n"
        "stubborn: sh -c \"trap '' TERM; echo stubborn up; while true; do sleep 0.1; done\"\n"
    )
    config = tmp_path / "toy.toml"
    config.write_text(
        "[supervisor]\nrestart_delay_seconds = 0.2\ncrash_limit = 3\ncrash_window_seconds = 30\n"
        "stop_timeout_seconds = 1.0\n"
    )
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen(
            [TRICKLE, "up", "--procfile", str(procfile), "-c", "steady=2"],
            env=child_env(config, {"TRICKLE_REDIS_URL": redis_url}),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while "crash loop" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # long enough for a fourth start, which must not come
        text = log_path.read_text()
        assert up.poll() is None, text
        assert text.count("flaky.1   | flaky up") == 3
        assert "flaky.1 exited with code 3" in text
        assert "restarting flaky.1 in 0 s" in text and "restarting flaky.1 in 0.2 s" in text
        assert "flaky.1 died 3 times within 30 s: crash loop, not restarting it" in text
        assert "steady.1  | port 5000" in text and "steady.2  | port 5001" in text
        started_pids = re.findall(r"(?:steady\.\d|stubborn\.1) started \(pid (\d+)\)", text)
        pids = [int(pid) for pid in started_pids]
        assert len(pids) == 3 and all(alive(pid) for pid in pids)
        assert "stubborn.1| stubborn up" in text
    finally:
        started = time.monotonic()
        up.terminate()
        code = up.wait(15)
    took = time.monotonic() - started
    assert code == 0 and took < 5
    assert not any(alive(pid) for pid in pids)
    assert "stubborn.1 did not stop within 1 s: SIGKILL" in log_path.read_text()
