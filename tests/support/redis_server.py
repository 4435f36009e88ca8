"""Throwaway Redis-compatible servers for the tests (no persistence, free ports).

The server is the one ``asyncq dev`` would run (:func:`asyncq.devserver.find_server_binary`):
``$ASYNCQ_REDIS_SERVER``, else ``redis-server``/``valkey-server`` on PATH, else the
Valkey binary of the ``embedded`` extra (in ``dev``). ``nox -s servers`` sets
``ASYNCQ_REDIS_SERVER`` to run the same tests on each server it has.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Sequence
from functools import cache

from asyncq.devserver import LocalServer, ServerBinary, find_server_binary, free_port

__all__ = ["RedisServer", "free_port", "server_binary"]


@cache
def server_binary() -> ServerBinary:
    """The server executable every test helper starts (resolved once per process)."""
    return find_server_binary()


class RedisServer(LocalServer):
    """One server child process on 127.0.0.1:<port>; ``stop()`` keeps its directory
    (a restart finds an AOF written with ``--appendonly yes``), ``cleanup()`` removes it."""

    def __init__(self, port: int | None = None, extra_args: Sequence[str] = ()) -> None:
        super().__init__(binary=server_binary(), port=port, extra_args=extra_args)
        self.keep_dir = True

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

    def restart(self) -> None:
        """Stop and start again on the same port (data is lost: no persistence)."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
