"""The listening socket of ``asyncq web`` and ``asyncq gateway``, bound before they say so."""

from __future__ import annotations

import socket

from asyncq.cli._app import CliError

__all__ = ["listen"]


def listen(host: str, port: int, option: str = "--port") -> socket.socket:
    """A socket listening on *host*:*port*, or a CliError naming the address and *option*.

    Bound here, before anything is printed, and handed to uvicorn: a port in use is
    one ``error:`` line instead of a "serving on" line followed by uvicorn's log.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise CliError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} "
            f"(another program has the port? choose one with {option} N)"
        ) from None
    sock.set_inheritable(True)
    return sock


def bound_port(sock: socket.socket) -> int:
    """The port *sock* listens on (the one the system chose for port 0)."""
    port: int = sock.getsockname()[1]
    return port
