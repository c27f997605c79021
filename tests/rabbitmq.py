"""A standalone RabbitMQ node for the tests: Debian's rabbitmq-server, started as this user.

Nothing here touches a system RabbitMQ (the package's service may or may not run): the node has
its own name, free ports for AMQP, Erlang distribution and epmd, and keeps its database, logs,
config and Erlang cookie in a temporary directory. No plugins (no management listener).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ops.redis_server import free_port

# The Debian package's own scripts: /usr/sbin/rabbitmq-server would switch to the rabbitmq user.
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
STARTUP_SECONDS = 90


def rabbitmq_missing() -> str | None:
    """Why no node can be started here, or None."""
    if not (RABBITMQ_BIN / "rabbitmq-server").exists() or shutil.which("epmd") is None:
        return "rabbitmq-server is not installed (apt-get install rabbitmq-server; .ci/run does)"
    return None


@dataclass
class RabbitNode:
    root: Path
    port: int
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def node(self) -> str:
        return self.env["RABBITMQ_NODENAME"]

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, *args],
            env=self.env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def start(self) -> None:
        with (self.root / "server.log").open("ab") as log:
            self.process = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            # await_startup fails at once until the node has registered with epmd.
            if self.ctl("await_startup", "--timeout", "30").returncode == 0:
                return
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"rabbitmq-server did not start; see {self.root}/server.log")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.ctl("stop", timeout=60)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        # epmd is started by the node as a daemon of its own, on this node's epmd port only.
        subprocess.run(["epmd", "-kill"], env=self.env, capture_output=True, check=False)


def start_rabbitmq(root: Path) -> RabbitNode:
    """A fresh node in ``root``, ready for AMQP on a free port."""
    root.mkdir(parents=True, exist_ok=True)
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    (root / "enabled_plugins").write_text("[].\n")
    (root / "rabbitmq.conf").write_text(
        f"loopback_users = none\nlisteners.tcp.1 = 127.0.0.1:{port}\n"
    )
    (root / "rabbitmq-env.conf").write_text("")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),  # the Erlang cookie lives here, shared by the node and rabbitmqctl
        "LANG": "C.UTF-8",
        "RABBITMQ_NODENAME": f"trickle-test-{port}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "ERL_EPMD_PORT": str(epmd_port),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_MNESIA_BASE": str(root / "mnesia"),
        "RABBITMQ_LOG_BASE": str(root / "log"),
        "RABBITMQ_LOGS": "-",
        "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(root / "advanced.config"),
        "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(root / "rabbitmq.pid"),
    }
    node = RabbitNode(root, port, env)
    node.start()
    return node
