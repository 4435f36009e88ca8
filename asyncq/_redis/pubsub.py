"""A lean Pub/Sub connection for the worker's subscriber (plain servers only).

It speaks the subset of redis-py's ``PubSub`` the subscriber uses
(``subscribe``/``unsubscribe``/``psubscribe``/``punsubscribe``,
``get_message``, ``aclose``, ``channels``/``patterns``) on its own socket,
dialled exactly as :class:`~asyncq._redis.transport.FastConnection` dials
(credentials, TLS, timeouts, local socket). Messages are parsed by
``hiredis`` in ``data_received`` and queued; ``get_message`` only pops the
queue. On the worker's pickup path (enqueue → wake-up message → fetch) this
skips redis-py's per-message parsing and timeout machinery. A channel given a
route (:meth:`FastPubSub.route`) skips the queue too: its messages' data go to
the route's callback from ``data_received``, in the turn of the event loop that
read them (a delivered task starts without waking the subscriber's task first).
:meth:`FastPubSub.track` turns on Redis key tracking (invalidation messages)
on the same connection before it subscribes.

Messages look like redis-py's: ``{"type": "message", "pattern": None,
"channel": b"...", "data": b"..."}``; an error reply (an ACL refusing a
channel: NoPermissionError) is raised by the ``get_message`` that reaches it,
as redis-py does. A lost connection raises ConnectionError from
``get_message``; the subscriber then opens a new one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from asyncq._redis.transport import _INCOMPLETE, FastConnection, _pack_command, _Protocol

__all__ = ["FastPubSub", "FastPubSubClient"]

_KINDS = {
    b"message": "message",
    b"pmessage": "pmessage",
    b"subscribe": "subscribe",
    b"unsubscribe": "unsubscribe",
    b"psubscribe": "psubscribe",
    b"punsubscribe": "punsubscribe",
}
_CONFIRMATIONS = frozenset(("subscribe", "unsubscribe", "psubscribe", "punsubscribe"))


class _PubSubProtocol(_Protocol):
    """A _Protocol that, once subscribed, queues every reply instead of matching waiters."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, address: str, read_timeout: float | None
    ) -> None:
        # no read timeout: a subscribed connection is silent for as long as nobody publishes
        super().__init__(loop, address, None)
        self.subscribed = False
        self.inbox: deque[dict[str, Any] | Exception] = deque()
        self.routes: dict[bytes, Callable[[bytes], None]] = {}
        """Channel -> the callback its messages' data go to instead of the inbox."""
        self._arrived: asyncio.Future[None] | None = None

    def data_received(self, data: bytes) -> None:
        if not self.subscribed:
            super().data_received(data)  # the handshake's replies
            return
        reader = self._reader
        reader.feed(data)
        inbox = self.inbox
        routes = self.routes
        queued = False
        while True:
            try:
                reply = reader.gets()
            except Exception as exc:  # a protocol error: the stream cannot be trusted
                what = f"Protocol error from {self.address}: {exc}"
                self.abort(partial(RedisConnectionError, what))
                return
            if reply is _INCOMPLETE:
                break
            if routes and type(reply) is list and len(reply) == 3 and reply[0] == b"message":
                route = routes.get(reply[1])
                if route is not None:
                    route(reply[2])
                    continue
            inbox.append(_message(reply))
            queued = True
        if queued:
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._wake()

    def _wake(self) -> None:
        arrived = self._arrived
        if arrived is not None and not arrived.done():
            arrived.set_result(None)

    async def next(self, timeout: float | None) -> dict[str, Any] | Exception | None:  # noqa: ASYNC109 - redis-py's get_message contract
        """The next queued message or error; None after *timeout* s without one."""
        if not self.inbox and self.lost is None:
            self._arrived = self.loop.create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._arrived
            except TimeoutError:
                return None
            finally:
                self._arrived = None
        if self.inbox:
            return self.inbox.popleft()
        if self.lost is not None:
            raise RedisConnectionError(f"Connection to {self.address} lost (Pub/Sub)")
        return None

    def write(self, data: bytes) -> None:
        if self.lost is not None or self.transport is None:
            raise RedisConnectionError(f"Connection to {self.address} lost (Pub/Sub)")
        self.transport.write(data)


def _message(reply: Any) -> dict[str, Any] | Exception:
    if isinstance(reply, Exception):
        return reply
    if not isinstance(reply, list) or not reply or not isinstance(reply[0], bytes):
        return RedisConnectionError(f"unexpected Pub/Sub reply {reply!r}")
    kind = _KINDS.get(reply[0], reply[0].decode(errors="replace"))
    if kind == "pmessage" and len(reply) == 4:
        return {"type": kind, "pattern": reply[1], "channel": reply[2], "data": reply[3]}
    if len(reply) == 3:
        return {"type": kind, "pattern": None, "channel": reply[1], "data": reply[2]}
    return RedisConnectionError(f"unexpected Pub/Sub reply {reply!r}")


class FastPubSub:
    """One subscribed connection; see the module docstring."""

    def __init__(self, conn: FastConnection) -> None:
        self._conn = conn
        self._proto: _PubSubProtocol | None = None
        self._routes: dict[bytes, Callable[[bytes], None]] = {}
        self.channels: dict[bytes, None] = {}
        self.patterns: dict[bytes, None] = {}

    def _use(self, proto: _PubSubProtocol) -> _PubSubProtocol:
        proto.routes = self._routes
        proto.subscribed = True
        self._proto = proto
        return proto

    async def _connected(self) -> _PubSubProtocol:
        if self._proto is None:
            proto = await self._conn.dial(_PubSubProtocol)
            assert isinstance(proto, _PubSubProtocol)
            return self._use(proto)
        return self._proto

    def route(self, channel: bytes, callback: Callable[[bytes], None]) -> None:
        """Give the data of every message on *channel* (subscribed, not a pattern) to
        *callback*, called from the connection's ``data_received`` as each is read, instead
        of queueing it for :meth:`get_message`. *callback* must not raise (an exception
        there is the event loop's to report, and the connection is lost)."""
        self._routes[channel] = callback

    async def _send(
        self, command: str, names: tuple[bytes | str, ...], into: dict[bytes, None]
    ) -> None:
        proto = await self._connected()
        encoded = [n.encode() if isinstance(n, str) else n for n in names]
        if command.startswith(("SUBSCRIBE", "PSUBSCRIBE")):
            into.update(dict.fromkeys(encoded))
        else:
            for n in encoded:
                into.pop(n, None)
        proto.write(_pack_command((command, *encoded)))

    async def track(self, prefixes: Sequence[str]) -> None:
        """Turn on Redis key tracking for this connection, before anything is subscribed.

        ``CLIENT TRACKING ON BCAST REDIRECT <own id> PREFIX ...``: once this
        connection subscribes ``__redis__:invalidate``, Redis sends it the name
        of every key under *prefixes* that any client writes (RESP2 delivers
        them as messages on that channel). An error reply (a server before
        6.0, a proxy or ACL refusing ``CLIENT``) is raised and the connection
        closed.
        """
        if self._proto is not None:
            raise RuntimeError("key tracking must be turned on before subscribing")
        proto = await self._conn.dial(_PubSubProtocol)
        assert isinstance(proto, _PubSubProtocol)
        try:
            client_id = await proto.send(_pack_command(("CLIENT", "ID")))
            args: list[bytes | str | int] = ["CLIENT", "TRACKING", "ON", "REDIRECT", client_id]
            args.append("BCAST")
            for prefix in prefixes:
                args += ("PREFIX", prefix)
            await proto.send(_pack_command(tuple(args)))
        except BaseException:
            await proto.close()
            raise
        self._use(proto)

    async def subscribe(self, *channels: bytes | str) -> None:
        await self._send("SUBSCRIBE", channels, self.channels)

    async def unsubscribe(self, *channels: bytes | str) -> None:
        await self._send("UNSUBSCRIBE", channels, self.channels)

    async def psubscribe(self, *patterns: bytes | str) -> None:
        await self._send("PSUBSCRIBE", patterns, self.patterns)

    async def punsubscribe(self, *patterns: bytes | str) -> None:
        await self._send("PUNSUBSCRIBE", patterns, self.patterns)

    async def get_message(
        self,
        ignore_subscribe_messages: bool = False,
        timeout: float | None = 0.0,  # noqa: ASYNC109 - redis-py's PubSub.get_message signature
    ) -> dict[str, Any] | None:
        """The next message (None after *timeout* s); an error reply is raised."""
        proto = await self._connected()
        while True:
            item = await proto.next(timeout)
            if item is None:
                return None
            if isinstance(item, Exception):
                raise item
            if ignore_subscribe_messages and item["type"] in _CONFIRMATIONS:
                continue
            return item

    async def aclose(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None:
            await proto.close()


class FastPubSubClient:
    """What :meth:`Connection.pubsub` returns for a plain server: a source of FastPubSub."""

    def __init__(self, conn: FastConnection) -> None:
        self._conn = conn

    def pubsub(self) -> FastPubSub:
        return FastPubSub(self._conn)

    async def aclose(self) -> None:
        """Nothing to close: each FastPubSub owns its socket."""
