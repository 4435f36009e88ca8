"""URL path segments, Host checks and JSON depth shared by the web UI and the HTTP gateway.

Task ids and queue names are any strings (Go asynq accepts ``/`` and ``..`` in
both), so a URL that names one must carry it as a single path segment that no
browser or router can split or shorten:

- :func:`quote_segment` percent-encodes everything but unreserved characters,
  ``/`` and ``~`` included. A name that is exactly ``.`` or ``..`` cannot be
  percent-encoded (browsers treat ``%2e%2e`` as ``..`` too), so it is written
  ``~.`` / ``~..``; a literal ``~`` is always encoded, so the two never meet.
- :class:`SegmentPaths` (ASGI middleware) rebuilds the routed path from the raw
  request path, keeping an encoded ``/`` inside its segment, and
  :func:`route_segments` makes every ``{name}`` parameter of the given routes
  decode that form back.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote

from starlette.convertors import Convertor, StringConvertor
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "LoopbackHosts",
    "SegmentPaths",
    "is_loopback",
    "json_depth",
    "listening_address",
    "loopback_host_problem",
    "quote_segment",
    "route_segments",
]

_DOTS = {".", ".."}
_ESCAPED = re.compile(r"%(25|2F)")


def quote_segment(value: object) -> str:
    """*value* as one URL path segment that addresses exactly it (see the module doc)."""
    text = str(value)
    if text in _DOTS:
        return "~" + text
    return quote(text, safe="").replace("~", "%7E")


def _decode(raw: str) -> str:
    if raw in ("~.", "~.."):
        return raw[1:]
    return unquote(raw)


def _escape(segment: str) -> str:
    return segment.replace("%", "%25").replace("/", "%2F")


def _unescape(value: str) -> str:
    return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else "/", value)


class _Segment(Convertor[str]):
    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return _unescape(value)

    def to_string(self, value: str) -> str:
        return _escape(value)


_SEGMENT = _Segment()


def route_segments(routes: Iterable[BaseRoute]) -> None:
    """Make every plain ``{name}`` parameter of *routes* read one whole encoded segment."""
    for route in routes:
        if isinstance(route, Route):
            for name, convertor in route.param_convertors.items():
                if isinstance(convertor, StringConvertor):
                    route.param_convertors[name] = _SEGMENT


def _segment_path(raw_path: bytes, path: str) -> str:
    raw_segments = raw_path.decode("latin-1").split("/")
    decoded = [_decode(s) for s in raw_segments]
    if not any("/" in d or "%" in d for d in decoded) and not any(
        s in ("~.", "~..") for s in raw_segments
    ):
        return path
    plain = "/".join(unquote(s) for s in raw_segments)
    if not path.endswith(plain):
        return path  # a server that rewrote the path itself: leave it be
    return path[: len(path) - len(plain)] + "/".join(_escape(d) for d in decoded)


class SegmentPaths:
    """Routes on raw path segments, so ``%2F`` inside a segment stays in that segment."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path")
        if scope["type"] in ("http", "websocket") and isinstance(raw, bytes):
            path = _segment_path(raw, scope["path"])
            if path != scope["path"]:
                scope = {**scope, "path": path}
        await self.app(scope, receive, send)


def is_loopback(host: str | None) -> bool:
    """Whether *host* (a name or an address, IPv6 with or without brackets) is this machine's
    loopback: ``localhost`` or any address in 127.0.0.0/8 or ::1."""
    if not host:
        return False
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _host_name(header: str) -> str | None:
    """The host of a ``Host`` header (brackets and port removed), None when malformed."""
    header = header.strip()
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return None
        name, rest = header[1:end], header[end + 1 :]
    else:
        name, sep, port = header.partition(":")
        rest = sep + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    return name.lower().rstrip(".")


def _same_host(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.partition("%")[0]) == ipaddress.ip_address(
            b.partition("%")[0]
        )
    except ValueError:
        return a == b


def loopback_host_problem(header: str | None, listening: str | None) -> str | None:
    """The one ``Host`` rule of a server that serves loopback only (the web UI on a loopback
    address, the gateway without a token): None when *header* names localhost, 127.0.0.1,
    ::1 or *listening* (the address the request came in on), with any port; else what is
    wrong, for the 400 answer. A DNS-rebinding page's requests carry its own name, and
    another loopback address is not this server either."""
    name = _host_name(header) if header else None
    if name is not None and any(
        _same_host(name, known)
        for known in (*_LOOPBACK_NAMES, *(() if listening is None else (listening.lower(),)))
    ):
        return None
    shown = ", ".join(_LOOPBACK_NAMES + (() if listening is None else (listening,)))
    return f"Host header {header!r} does not name this server ({shown}, with any port)"


class LoopbackHosts:
    """ASGI middleware: 400 for a request whose ``Host`` breaks :func:`loopback_host_problem`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            problem = loopback_host_problem(
                Headers(scope=scope).get("host"), listening_address(scope)
            )
            if problem is not None:
                await PlainTextResponse(problem, status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def listening_address(scope: Scope) -> str | None:
    """The address the request came in on (None: not a TCP socket, e.g. a Unix one)."""
    server = scope.get("server")
    return str(server[0]) if server else None


def json_depth(value: Any) -> int:
    """How deep decoded JSON nests (a scalar is 0, ``[]`` is 1), without recursion, so a
    hostile body thousands of levels deep is measured instead of overflowing the stack."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            stack.extend(
                (v, level + 1) for v in (node.values() if isinstance(node, dict) else node)
            )
    return deepest
