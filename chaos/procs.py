"""Real redis-server processes for the scenarios: single (AOF or not), Sentinel, Cluster."""

from __future__ import annotations

import functools
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from asyncq.devserver import find_server_binary

__all__ = ["ClusterGroup", "RedisProc", "SentinelGroup", "free_port", "redis_cli"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def redis_cli(port: int, *args: str, timeout: float = 20.0) -> str:
    """Run redis-cli against 127.0.0.1:<port>; its stdout."""
    proc = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return proc.stdout


def _link_up(port: int) -> bool:
    return "master_link_status:up" in redis_cli(port, "info", "replication")


def _cluster_ok(port: int) -> bool:
    return "cluster_state:ok" in redis_cli(port, "cluster", "info")


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (subprocess.SubprocessError, OSError) as exc:
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}" + (f": {last}" if last else ""))


class RedisProc:
    """One redis-server on 127.0.0.1:<port> with its own data directory.

    The port and directory survive :meth:`kill` / :meth:`terminate` so that
    :meth:`start` again is a restart that reloads the AOF when it is on.
    """

    def __init__(self, *args: str, port: int | None = None) -> None:
        # The server asyncq dev and the tests run: redis-server from PATH, else the embedded one.
        self.binary = str(find_server_binary().path)
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"asyncq-chaos-{self.port}-"))
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> RedisProc:
        argv = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--loglevel", "warning",
            "--shutdown-timeout", "0",
            *self.args,
        ]  # fmt: skip
        log = (self.dir / "redis.log").open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited early")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final fsync."""
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM: Redis's clean shutdown (flushes and fsyncs the AOF)."""
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
        self.proc = None

    def cleanup(self, logs: Path | None = None) -> None:
        """Stop the server and remove its directory; its log is copied first into *logs*
        when that directory exists (a failed scenario's, which the harness keeps)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        _keep(self.dir / "redis.log", logs, f"redis-{self.port}.log")
        shutil.rmtree(self.dir, ignore_errors=True)


def _keep(log: Path, logs: Path | None, name: str) -> None:
    """Copy *log* into the directory *logs* as *name*, when both exist."""
    if logs is not None and logs.is_dir() and log.is_file():
        shutil.copyfile(log, logs / name)


class SentinelGroup:
    """A master, *replicas* replicas and *sentinels* sentinels (quorum 2) for ``mymaster``."""

    name = "mymaster"
    down_after = 3.0
    """Seconds a master must not answer before the sentinels fail it over: at 1 s, the
    master they had just promoted was found "down" on a loaded CI machine and failed over
    a second time."""

    def __init__(self, replicas: int = 2, sentinels: int = 3) -> None:
        self.master = RedisProc("--repl-diskless-sync-delay", "0")
        self.replicas = [
            RedisProc("--replicaof", "127.0.0.1", str(self.master.port)) for _ in range(replicas)
        ]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.dir = Path(tempfile.mkdtemp(prefix="asyncq-chaos-sentinel-"))
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis-sentinel://{hosts}?master={self.name}"

    @property
    def nodes(self) -> list[RedisProc]:
        return [self.master, *self.replicas]

    def start(self) -> SentinelGroup:
        self.master.start()
        for replica in self.replicas:
            replica.start()
        for replica in self.replicas:
            wait_for(
                functools.partial(_link_up, replica.port),
                "replica sync",
            )
        binary = shutil.which("redis-sentinel")
        for n, port in enumerate(self.sentinel_ports):
            conf = self.dir / f"sentinel-{n}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.name} {int(self.down_after * 1000)}\n"
                f"sentinel failover-timeout {self.name} 5000\n"
                f"sentinel parallel-syncs {self.name} 2\n"
            )
            args = [binary, str(conf)] if binary else [self.master.binary, str(conf), "--sentinel"]
            log = (self.dir / f"sentinel-{n}.log").open("ab")
            self.sentinels.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        for port in self.sentinel_ports:
            wait_for(
                functools.partial(self._knows_others, port),
                "sentinels to discover each other",
            )
        return self

    def _knows_others(self, port: int) -> bool:
        out = redis_cli(port, "sentinel", "master", self.name)
        return f"num-other-sentinels\n{len(self.sentinel_ports) - 1}" in out

    def current_master_port(self) -> int:
        out = redis_cli(self.sentinel_ports[0], "sentinel", "get-master-addr-by-name", self.name)
        return int(out.split()[1])

    def cleanup(self, logs: Path | None = None) -> None:
        """Stop every process and remove their files, keeping their logs in *logs* as
        :meth:`RedisProc.cleanup` does: the sentinels' say which failovers they made."""
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for n in range(len(self.sentinel_ports)):
            _keep(self.dir / f"sentinel-{n}.log", logs, f"sentinel-{n}.log")
        for node in self.nodes:
            node.cleanup(logs)
        shutil.rmtree(self.dir, ignore_errors=True)


class ClusterGroup:
    """*masters* cluster masters, each with one replica, joined by ``redis-cli --cluster``."""

    def __init__(self, masters: int = 3) -> None:
        self.nodes: list[RedisProc] = []
        for _ in range(masters * 2):
            node = RedisProc()
            node.args = [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(node.dir / "nodes.conf"),
                "--cluster-port", str(free_port()),
                "--cluster-node-timeout", "1500",
                "--repl-diskless-sync-delay", "0",
            ]  # fmt: skip
            self.nodes.append(node)

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> ClusterGroup:
        for node in self.nodes:
            node.start()
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *addrs,
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        for node in self.nodes:
            wait_for(
                functools.partial(_cluster_ok, node.port),
                "cluster_state:ok",
            )
        for node in self.nodes:
            if self.role(node) == "slave":
                wait_for(
                    functools.partial(_link_up, node.port),
                    "cluster replica sync",
                )
        return self

    def role(self, node: RedisProc) -> str:
        for line in redis_cli(node.port, "info", "replication").splitlines():
            if line.startswith("role:"):
                return line.split(":", 1)[1].strip()
        return "unknown"

    def masters(self, alive: Sequence[RedisProc] | None = None) -> list[RedisProc]:
        return [n for n in (alive or self.nodes) if n.proc is not None and self.role(n) == "master"]

    def cleanup(self, logs: Path | None = None) -> None:
        for node in self.nodes:
            node.cleanup(logs)
