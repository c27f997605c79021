"""A small process supervisor: what `trickle up` runs the Procfile (and the embedded Redis) with.

honcho stops every process as soon as one dies, so one worker's OOM kill took the web tier,
Redis and every open stream down with it. Here a process that dies is restarted on its own: at
once the first time, then after a delay that doubles per death; one that keeps dying
(``crash_limit`` deaths within ``crash_window_seconds``) is left stopped with a log line saying
so, while the others keep serving. Each child runs in its own session, so it is signalled (and
cleaned up, gunicorn's workers included) as a group, and a terminal's Ctrl-C reaches only the
supervisor, which then stops everything in order: SIGTERM, SIGKILL after
``stop_timeout_seconds``, Redis last.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Protocol, TextIO

from trickle.config.sections import SupervisorSettings


class Process(Protocol):
    """What the supervisor needs of a child: ``subprocess.Popen`` or a forked worker."""

    pid: int
    returncode: int | None
    stdout: IO[bytes] | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


Launch = Callable[[], Process]


@dataclass(frozen=True)
class RespawnPolicy:
    """When a dead process starts again, when it is left stopped, and how long a stop waits
    (``[supervisor]``); the engine's batch restarts are ``worker.engine.policy.RestartPolicy``."""

    delay_seconds: float = 0.5
    max_delay_seconds: float = 10.0
    crash_limit: int = 5
    crash_window_seconds: float = 60.0
    stop_timeout_seconds: float = 7.0

    @classmethod
    def from_settings(cls, settings: SupervisorSettings) -> RespawnPolicy:
        return cls(
            settings.restart_delay_seconds,
            settings.max_restart_delay_seconds,
            settings.crash_limit,
            settings.crash_window_seconds,
            settings.stop_timeout_seconds,
        )

    def delay_after(self, crashes: int) -> float:
        """Backoff before restart number ``crashes``: at once after a first death (an OOM kill
        should cost no more than the restart), then 0.5, 1, 2, 4 ... s."""
        if crashes <= 1:
            return 0.0
        return float(min(self.delay_seconds * 2 ** (crashes - 2), self.max_delay_seconds))


@dataclass
class Child:
    """One supervised process: a Procfile instance (``worker.2``) or the embedded Redis."""

    name: str
    kind: str
    launch: Launch
    port: int = 0
    # Started first and stopped last; if it gives up, the whole stack stops (Redis).
    essential: bool = False
    process: Process | None = None
    started_at: float = 0.0
    crashes: list[float] = field(default_factory=list)
    restart_at: float | None = None
    given_up: bool = False
    retiring: bool = False  # asked to stop (scale-down): its exit is not a crash
    kill_at: float | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class Supervisor:
    def __init__(self, policy: RespawnPolicy, out: TextIO | None = None) -> None:
        self.policy = policy
        self.children: dict[str, Child] = {}
        self.on_tick: list[Callable[[], None]] = []
        self.exit_code = 0
        self._out = out or sys.stdout
        self._out_lock = threading.Lock()
        # A plain flag, not a threading.Event: Event.set() from a signal handler can deadlock
        # on the lock the interrupted Event.wait() of the main loop holds.
        self._stop_requested = False

    def log(self, message: str, source: str = "trickle") -> None:
        with self._out_lock:
            self._out.write(f"{time.strftime('%H:%M:%S')} {source:<10}| {message}\n")
            self._out.flush()

    def add(self, child: Child) -> Child:
        """Register and start a child (a restart later reuses its name and launch)."""
        self.children[child.name] = child
        self._start(child)
        return child

    def retire(self, name: str, grace_seconds: float | None = None) -> None:
        """Stop a child for good (scale-down): SIGTERM now, SIGKILL after ``grace_seconds``
        (default: the stop timeout), so a worker's warm shutdown can finish its batch."""
        child = self.children.get(name)
        if child is None or child.retiring:
            return
        child.retiring = True
        child.restart_at = None
        grace = self.policy.stop_timeout_seconds if grace_seconds is None else grace_seconds
        child.kill_at = time.monotonic() + grace
        if child.alive:
            self._signal(child, signal.SIGTERM)

    def request_stop(self, *_: object) -> None:
        """Signal-handler safe (sets a flag): the main loop notices and shuts down."""
        self._stop_requested = True

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)

    def run(self) -> int:
        try:
            while not self._stop_requested:
                self.tick()
                time.sleep(0.1)
        finally:
            self.shutdown()
        return self.exit_code

    def tick(self) -> None:
        now = time.monotonic()
        for child in list(self.children.values()):
            self._check(child, now)
        for hook in self.on_tick:
            hook()

    def shutdown(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after the timeout, Redis last."""
        self.log("stopping every process")
        ordinary = [c for c in self.children.values() if not c.essential]
        essential = [c for c in self.children.values() if c.essential]
        for group, timeout in ((ordinary, self.policy.stop_timeout_seconds), (essential, 2.0)):
            for child in group:
                if child.alive:
                    self._signal(child, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while any(c.alive for c in group) and time.monotonic() < deadline:
                time.sleep(0.05)
            for child in group:
                if child.alive:
                    self.log(f"{child.name} did not stop within {timeout:g} s: SIGKILL")
                self._signal(child, signal.SIGKILL)  # and any orphans of its group
                if child.process is not None:
                    child.process.wait()

    def _start(self, child: Child) -> None:
        child.restart_at = None
        try:
            child.process = child.launch()
        except Exception as exc:  # a launch that fails counts as a crash
            self.log(f"{child.name} failed to start: {exc}")
            child.process = None
            self._crashed(child, time.monotonic())
            return
        child.started_at = time.monotonic()
        self.log(f"{child.name} started (pid {child.process.pid})")
        if child.process.stdout is not None:
            threading.Thread(
                target=self._pump, args=(child.name, child.process.stdout), daemon=True
            ).start()

    def _check(self, child: Child, now: float) -> None:
        process = child.process
        if process is None:
            if (
                child.restart_at is not None
                and now >= child.restart_at
                and not self._stop_requested
            ):
                self._start(child)
            return
        code = process.poll()
        if code is None:
            if child.retiring and child.kill_at is not None and now >= child.kill_at:
                self.log(f"{child.name} did not stop in time: SIGKILL")
                self._signal(child, signal.SIGKILL)
            return
        self._signal(child, signal.SIGKILL)  # orphans of its group (gunicorn's workers)
        child.process = None
        if child.retiring:
            self.log(f"{child.name} stopped ({describe_exit(code)})")
            del self.children[child.name]
            return
        self.log(f"{child.name} {describe_exit(code)}")
        self._crashed(child, now)

    def _crashed(self, child: Child, now: float) -> None:
        window = self.policy.crash_window_seconds
        child.crashes = [t for t in child.crashes if now - t < window] + [now]
        if len(child.crashes) >= self.policy.crash_limit:
            child.given_up = True
            self.log(
                f"{child.name} died {len(child.crashes)} times within {window:g} s: crash loop, "
                "not restarting it" + ("" if child.essential else "; the other processes go on")
            )
            if child.essential:
                self.exit_code = 1
                self._stop_requested = True
            return
        delay = self.policy.delay_after(len(child.crashes))
        child.restart_at = now + delay
        self.log(
            f"restarting {child.name} in {delay:g} s "
            f"(death {len(child.crashes)} of {self.policy.crash_limit} allowed within {window:g} s)"
        )

    @staticmethod
    def _signal(child: Child, signum: int) -> None:
        if child.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signum)

    def _pump(self, name: str, stream: IO[bytes]) -> None:
        """Copy a child's output line by line, prefixed with its name (as honcho does)."""
        with stream:
            for raw in iter(stream.readline, b""):
                self.log(raw.decode("utf-8", "replace").rstrip("\n"), source=name)
