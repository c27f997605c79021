"""`trickle up` as an operator runs it (embedded Redis, Procfile, supervisor), for the tests."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ops.redis_server import free_port
from ops.stack import answers, child_env, spawn, wait_until

TRICKLE = str(Path(sys.executable).parent / "trickle")


@dataclass
class UpStack:
    process: subprocess.Popen[bytes]
    log_path: Path
    base: str
    redis_url: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pid(self, name: str) -> int:
        """The pid of the latest start of a supervised process (``worker.1``, ``redis``)."""
        found = re.findall(rf"\| {re.escape(name)} started \(pid (\d+)\)", self.log())
        assert found, f"{name} never started:\n{self.log()[-3000:]}"
        return int(found[-1])

    def wait_log(self, pattern: str, timeout: float, after: int = 0) -> float:
        """Wait for a log line matching ``pattern`` past offset ``after``; returns when seen."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.log()[after:]):
            assert time.monotonic() < deadline, (
                f"no {pattern!r} within {timeout}s:\n" + (self.log()[after:][-3000:])
            )
            time.sleep(0.05)
        return time.monotonic()

    def stop(self, timeout: float = 30) -> float:
        """SIGTERM `trickle up` (as make's Ctrl-C does); returns how long it took to exit."""
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return time.monotonic() - started


def start_up(
    root: Path, config_body: str, *args: str, env: dict[str, str] | None = None
) -> UpStack:
    """Write a config (own Redis and web ports), run `trickle up`, wait for /readyz."""
    redis_port, web_port = free_port(), free_port()
    config = root / "up.toml"
    config.write_text(
        f'default_model = "demo"\n[redis]\nurl = "redis://127.0.0.1:{redis_port}/0"\n'
        f"[web]\nport = {web_port}\nkeepalive_seconds = 1.0\n{config_body}"
    )
    log_path = root / "up.log"
    argv = [TRICKLE, "up", "--data-dir", str(root / "data"), *args]
    process = spawn(argv, child_env(config, env), log_path)
    up = UpStack(
        process, log_path, f"http://127.0.0.1:{web_port}", f"redis://127.0.0.1:{redis_port}/0"
    )
    try:
        wait_until(lambda: answers(f"{up.base}/readyz"), process, 90, "trickle up")
    except (RuntimeError, TimeoutError) as exc:
        up.stop()
        raise AssertionError(f"{exc}:\n{up.log()[-3000:]}") from None
    return up


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
