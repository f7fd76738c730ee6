"""Real Redis Cluster and Sentinel sets for the tests, on free loopback ports.

``RedisCluster``: six ``redis-server --cluster-enabled yes`` nodes joined by
``redis-cli --cluster create --cluster-replicas 1`` (three primaries, three replicas).
``SentinelSet``: one primary, one replica and three ``redis-server --sentinel`` processes
watching it under the service name ``mymaster`` with short timeouts (down after 1 s), so a
failover takes seconds.

Both start from the Debian binaries when they exist and report a reason otherwise, so the
tests that need them skip instead of failing. Every process runs in its own temp dir and is
killed at teardown. Also used by bench/cluster.py.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tests.ports import free_port


def free_port_pair() -> int:
    """A free loopback port whose ``+10000`` cluster bus port is free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        try:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


def _wait_ping(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if redis.Redis(port=port, socket_timeout=0.5).ping():
                return True
        except redis.RedisError:
            time.sleep(0.05)
    return False


class _Servers:
    """Processes started in one temp dir; all killed (SIGKILL) and removed by ``stop``."""

    prefix = "robot-lab-servers-"

    def __init__(self) -> None:
        self.dir: Path | None = None
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.reason = ""

    def _spawn(self, port: int, args: list[str]) -> subprocess.Popen[bytes]:
        assert self.dir is not None
        node_dir = self.dir / str(port)
        node_dir.mkdir(exist_ok=True)
        log = open(node_dir / "server.log", "wb")
        proc = subprocess.Popen(["redis-server", *args], cwd=node_dir, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs[port] = proc
        return proc

    def kill(self, port: int, sig: int = signal.SIGKILL) -> None:
        """kill -9 the server on ``port`` (a crashed host, no shutdown save)."""
        proc = self.procs.pop(port)
        proc.send_signal(sig)
        proc.wait(5)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def logs(self) -> str:
        if self.dir is None:
            return ""
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(self.dir.glob("*/*.log")))


def _common(port: int) -> list[str]:
    # repl-diskless-sync-delay 0: a replica's first full sync starts at once, not after 5 s
    return ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", ".", "--protected-mode", "no", "--repl-diskless-sync-delay", "0"]


class RedisCluster(_Servers):
    """Three primaries with one replica each. ``url`` is a ``redis+cluster://`` URL naming
    every node; ``primaries()`` / ``replicas()`` read the live roles."""

    def __init__(self, primaries: int = 3, replicas: int = 1) -> None:
        super().__init__()
        self.size = primaries * (1 + replicas)
        self.replicas_per_primary = replicas
        self.ports: list[int] = []
        self.url: str | None = None

    def start(self, timeout: float = 30.0) -> str | None:
        if not shutil.which("redis-server") or not shutil.which("redis-cli"):
            self.reason = "redis-server / redis-cli not on PATH"
            return None
        self.dir = Path(tempfile.mkdtemp(prefix="robot-lab-cluster-"))
        try:
            self.ports = [free_port_pair() for _ in range(self.size)]
            for port in self.ports:
                # node timeout 2 s: a killed primary's replica is promoted within seconds
                self._spawn(port, [*_common(port), "--cluster-enabled", "yes", "--cluster-config-file",
                                   "nodes.conf", "--cluster-node-timeout", "2000"])
            if not all(_wait_ping(p) for p in self.ports):
                raise RuntimeError("a cluster node did not start")
            create = subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-replicas", str(self.replicas_per_primary), "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout)
            if create.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-800:]}{create.stderr[-800:]}")
            self.wait_ok(timeout)
        except Exception as exc:
            self.reason = f"Redis Cluster did not start: {exc}"
            self.stop()
            return None
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return self.url

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok`` with all slots served and every
        replica has finished its first sync (``master_link_status:up``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                infos = [redis.Redis(port=p, socket_timeout=1).cluster("info") for p in self.procs]
                ok = all(i.get("cluster_state") == "ok" and int(i.get("cluster_slots_ok", 0)) == 16384
                         for i in infos)
                replicas = self.replicas()
                synced = all(redis.Redis(port=p).info("replication").get("master_link_status") == "up"
                             for p in replicas)
                if ok and synced and len(replicas) >= len(self.procs) - 3:
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ok within {timeout} s")
            time.sleep(0.1)

    def _role(self, port: int) -> str:
        return redis.Redis(port=port, socket_timeout=1).execute_command("ROLE")[0].decode()

    def primaries(self) -> list[int]:
        return [p for p in self.procs if self._role(p) == "master"]

    def replicas(self) -> list[int]:
        return [p for p in self.procs if self._role(p) == "slave"]


class SentinelSet(_Servers):
    """A primary, a replica and three sentinels (quorum 2) on loopback; service ``mymaster``."""

    service = "mymaster"

    def __init__(self, down_after_ms: int = 1000, failover_timeout_ms: int = 3000) -> None:
        super().__init__()
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.primary_port = 0
        self.replica_port = 0
        self.sentinel_ports: list[int] = []
        self.url: str | None = None

    def start(self, timeout: float = 20.0) -> str | None:
        if not shutil.which("redis-server"):
            self.reason = "redis-server not on PATH"
            return None
        self.dir = Path(tempfile.mkdtemp(prefix="robot-lab-sentinel-"))
        try:
            self.primary_port, self.replica_port = free_port(), free_port()
            self._spawn(self.primary_port, _common(self.primary_port))
            self._spawn(self.replica_port, [*_common(self.replica_port),
                                            "--replicaof", "127.0.0.1", str(self.primary_port)])
            if not (_wait_ping(self.primary_port) and _wait_ping(self.replica_port)):
                raise RuntimeError("primary or replica did not start")
            self.sentinel_ports = [free_port() for _ in range(3)]
            for port in self.sentinel_ports:
                conf = self.dir / f"sentinel-{port}.conf"  # sentinels rewrite their config file
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\nprotected-mode no\n"
                    f"sentinel monitor {self.service} 127.0.0.1 {self.primary_port} 2\n"
                    f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}\n"
                    f"sentinel parallel-syncs {self.service} 1\n")
                self._spawn(port, [str(conf), "--sentinel"])
            if not all(_wait_ping(p) for p in self.sentinel_ports):
                raise RuntimeError("a sentinel did not start")
            self._wait_ready(timeout)
        except Exception as exc:
            self.reason = f"Sentinel set did not start: {exc}"
            self.stop()
            return None
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        self.url = f"redis+sentinel://{hosts}/{self.service}/0"
        return self.url

    def _wait_ready(self, timeout: float) -> None:
        """Until the replica is in sync and every sentinel knows the replica and the others.

        A sentinel learns of replicas from the primary's INFO (every 10 s, the first soon
        after it connects): one that had not yet, when a test kills the primary, has no
        replica to promote and never will (the primary that would name it is gone) -- the
        failover test waited its 90 s in vain on a loaded CI machine."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                info = redis.Redis(port=self.primary_port).info("replication")
                synced = info.get("connected_slaves") == 1 and info.get("slave0", {}).get("state") == "online"
                views = [redis.Redis(port=p).sentinel_master(self.service) for p in self.sentinel_ports]
                known = all(v["num-other-sentinels"] == 2 and v["num-slaves"] == 1 for v in views)
                if synced and known:
                    return
            except (redis.RedisError, KeyError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"sentinels not ready within {timeout} s")

    def master_port(self) -> int:
        """The port the sentinels currently name as primary."""
        host, port = redis.Redis(port=self.sentinel_ports[0]).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return int(port)


class SingleRedis(_Servers):
    """One plain redis-server (the other side of bench/cluster.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.url: str | None = None

    def start(self) -> str | None:
        if not shutil.which("redis-server"):
            self.reason = "redis-server not on PATH"
            return None
        self.dir = Path(tempfile.mkdtemp(prefix="robot-lab-single-"))
        port = free_port()
        self._spawn(port, _common(port))
        if not _wait_ping(port):
            self.reason = "redis-server did not start"
            self.stop()
            return None
        self.url = f"redis://127.0.0.1:{port}/0"
        return self.url
