"""Throwaway redis-server processes for the tests (no persistence, free ports)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["RedisServer", "free_port"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """One redis-server child process on 127.0.0.1:<port>, removed on stop()."""

    def __init__(self, port: int | None = None, extra_args: Sequence[str] = ()) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not on PATH; set ASYNCQ_TEST_REDIS_URL instead")
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"asyncq-redis-{self.port}-"))
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--loglevel", "warning",
            *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited early")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port (data is lost: no persistence)."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
