"""A lean multiplexed RESP connection for the Broker's hot path.

redis-py spends most of a round trip on its own machinery (pool checkout,
per-argument encoding, timeouts, hooks). :class:`FastConnection` keeps one
socket per Broker and pipelines every caller's commands on it: a call packs
its command with ``hiredis.pack_command``, writes it and awaits a future;
replies are parsed by ``hiredis.Reader`` and resolve the futures in FIFO
order. Only a plain server (TCP, unix socket or TLS) is supported; Sentinel,
Cluster and user-supplied clients stay on redis-py.

Errors are redis-py's: error replies are mapped exactly as redis-py maps them
(``NOSCRIPT`` -> NoScriptError, ``-ERR x`` -> ResponseError("x"), ...).
A lost connection fails every call in flight with ConnectionError (the
command may or may not have run). When the oldest call in flight has waited
``read_timeout`` without a byte arriving, every call in flight fails with
TimeoutError and the connection is dropped, because the replies behind it
could no longer be matched. The next call reconnects; only
the connect is retried, never a command that was written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import hiredis
from redis._parsers.base import BaseParser
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    DataError,
    InvalidResponse,
    RedisError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

if TYPE_CHECKING:
    from asyncq._redis.options import RedisClientOpts, TLSConfig

__all__ = ["FastConnection", "PackedCommand"]

Arg = str | bytes | int | float
"""What a command argument may be (bools and None are rejected, as in redis-py)."""

_EARLY = 8
"""Buffered commands that go out before the loop iteration ends, while Redis has little queued."""
_AHEAD = 64
"""Commands written and unanswered above which buffered ones wait for the iteration's end."""
_INCOMPLETE = object()  # hiredis.Reader's "no complete reply yet" marker
_pack: Callable[[tuple[Any, ...]], bytes] = hiredis.pack_command
_parse_error: Callable[[str], Exception] = BaseParser.parse_error


def _normalize(args: Sequence[Any]) -> tuple[Arg, ...]:
    """Arguments hiredis cannot pack, converted as redis-py's Encoder would (or DataError)."""
    out: list[Arg] = []
    for arg in args:
        if isinstance(arg, bytes | str | float):
            out.append(arg)
        elif isinstance(arg, bool) or arg is None:
            raise DataError(
                f"Invalid input of type: {type(arg).__name__!r}. "
                "Convert to a bytes, string, int or float first."
            )
        elif isinstance(arg, int):
            out.append(int(arg))
        elif isinstance(arg, bytearray | memoryview):
            out.append(bytes(arg))
        else:
            raise DataError(
                f"Invalid input of type: {type(arg).__name__!r}. "
                "Convert to a bytes, string, int or float first."
            )
    return tuple(out)


def _pack_command(args: tuple[Any, ...]) -> bytes:
    try:
        return _pack(args)
    except TypeError:
        return _pack(_normalize(args))


class PackedCommand:
    """A command whose fixed arguments are packed once; each call fills in its own.

    *args* are the command's arguments in order, with None where each call gives its
    own. :attr:`format` ``% (len(v1), v1, len(v2), v2, ...)``, for the call's bytes
    *v1*, *v2*, ... in order, is what packing the whole command gives
    (:meth:`FastConnection.execute_command`), in a third of the time of packing a
    script call's dozen arguments each time. The caller spreads its values itself: a
    fixed number of them, written out, costs half of a loop that spreads any number.
    """

    __slots__ = ("format",)

    def __init__(self, args: Sequence[Arg | None]) -> None:
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            if arg is None:
                parts.append(b"$%d\r\n%b\r\n")
            else:  # packed alone, less its "*1\r\n" count, and kept literal in the format
                parts.append(_pack_command((arg,))[4:].replace(b"%", b"%%"))
        self.format = b"".join(parts)


class _Batch:
    """The waiter of a pipeline: collects *size* replies, exceptions included."""

    __slots__ = ("future", "replies", "size")

    def __init__(self, future: asyncio.Future[list[Any]], size: int) -> None:
        self.future = future
        self.size = size
        self.replies: list[Any] = []


class _Protocol(asyncio.Protocol):
    """One socket: writes packed commands, matches replies to waiters in FIFO order."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, address: str, read_timeout: float | None
    ) -> None:
        self.loop = loop
        self.address = address
        self.read_timeout = read_timeout
        self.ready = False  # connected, not lost, not paused: a call may write right away
        self.lost: Exception | None = None
        self.transport: asyncio.Transport | None = None
        self._time = loop.time
        self._reader = hiredis.Reader(
            notEnoughData=_INCOMPLETE, protocolError=InvalidResponse, replyError=_parse_error
        )
        self._waiters: deque[asyncio.Future[Any] | _Batch] = deque()
        self._out: list[bytes] = []  # packed commands not yet written (see _write)
        self._flushing = False  # a _flush is scheduled
        self._holding = False  # writes wait for that _flush even with nothing in flight
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0  # loop time of the last bytes received
        self._busy_since = 0.0  # loop time of the last write made with nothing in flight
        self._paused = False
        self._resumed: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] = loop.create_future()

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)
        self.ready = True

    def data_received(self, data: bytes) -> None:
        self._last_read = self._time()
        reader = self._reader
        reader.feed(data)
        waiters = self._waiters
        before = len(waiters)
        while True:
            try:
                reply = reader.gets()
            except InvalidResponse as exc:
                self.abort(
                    partial(RedisConnectionError, f"Protocol error from {self.address}: {exc}")
                )
                return
            if reply is _INCOMPLETE:
                # One reply resumes one caller (a serial one, whose next write goes out
                # at once); several resume several, whose next writes can share one.
                if before - len(waiters) > 1:
                    self._hold()
                return
            if not waiters:
                what = f"Unexpected reply from {self.address}: {reply!r}"
                self.abort(partial(RedisConnectionError, what))
                return
            waiter = waiters[0]
            if isinstance(waiter, _Batch):
                replies = waiter.replies
                replies.append(reply)
                if len(replies) < waiter.size:
                    continue
                waiters.popleft()
                if not waiter.future.done():
                    waiter.future.set_result(replies)
                continue
            waiters.popleft()
            if waiter.done():  # the caller was cancelled; its reply is dropped
                continue
            if isinstance(reply, Exception):
                waiter.set_exception(reply)
            else:
                waiter.set_result(reply)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost fails what is in flight

    def connection_lost(self, exc: Exception | None) -> None:
        self.ready = False
        if self.lost is None:
            why = f": {exc}" if exc is not None else ""
            self.lost = RedisConnectionError(f"Connection to {self.address} lost{why}")
            self._fail_all(
                lambda: RedisConnectionError(
                    f"Connection to {self.address} lost{why} (the command may or may not have run)"
                )
            )
        self._wake_writers()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True
        self.ready = False

    def resume_writing(self) -> None:
        self._paused = False
        self.ready = self.lost is None
        self._wake_writers()

    # -- requests -----------------------------------------------------------------------

    def send(self, data: bytes) -> asyncio.Future[Any]:
        """Write one packed command; the future gets its reply (or its error reply raised)."""
        fut = self.loop.create_future()
        self._write(data, fut)
        return fut

    def send_batch(self, data: bytes, size: int) -> asyncio.Future[list[Any]]:
        """Write *size* packed commands at once; the future gets all replies, errors in place."""
        fut: asyncio.Future[list[Any]] = self.loop.create_future()
        self._write(data, _Batch(fut, size))
        return fut

    def _write(self, data: bytes, waiter: asyncio.Future[Any] | _Batch) -> None:
        # Coalescing: a call made while others are in flight is buffered, and the buffer
        # goes out in one send() at the end of the loop iteration's callbacks, so N
        # concurrent callers cost one syscall and Redis reads them in one go; while Redis
        # has little queued (< _AHEAD written, unanswered), every _EARLY buffered commands
        # go out at once, so Redis works on them while this loop builds the rest (32
        # callers: 1.87x the tasks/s of one send() per iteration, measured in issue 40).
        # With nothing in flight (the serial caller) the write goes out at once: no extra
        # loop iteration on its round trip, unless _hold says that more callers are about
        # to write in this iteration.
        waiters = self._waiters
        if waiters:
            waiters.append(waiter)
        else:
            waiters.append(waiter)
            self._busy_since = self._time()
            if self._timer is None and self.read_timeout is not None:
                self._arm()
            if not self._holding:
                self.transport.write(data)  # type: ignore[union-attr]  # set while ready
                return
        out = self._out
        out.append(data)
        if len(out) >= _EARLY and len(waiters) - len(out) < _AHEAD:
            # Redis has little queued: these go out now, so Redis works on them while
            # this loop builds the rest instead of both taking turns.
            self._out = []
            self.transport.write(b"".join(out))  # type: ignore[union-attr]  # set while ready
        elif not self._flushing:
            self._flushing = True
            self.loop.call_soon(self._flush)

    def _hold(self) -> None:
        """Buffer the writes of the callers whose replies were just matched.

        Their futures' callbacks are already queued; a _flush queued after them runs
        once they have run, in the same iteration, so the commands each writes on
        resuming (the next enqueue of a busy producer) go out in one send().
        """
        self._holding = True
        if not self._flushing:
            self._flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        self._holding = False
        out = self._out
        if not out:
            return
        self._out = []
        if self.lost is None and self.transport is not None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    async def writable(self) -> None:
        """Wait while the write buffer is above its high-water mark."""
        while self._paused and self.lost is None:
            if self._resumed is None or self._resumed.done():
                self._resumed = self.loop.create_future()
            await asyncio.shield(self._resumed)

    def _wake_writers(self) -> None:
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    # -- read timeout -------------------------------------------------------------------
    # As a socket timeout: the connection fails when the oldest call in flight has
    # waited read_timeout without a byte arriving (a long pipeline whose replies
    # keep coming is fine). One timer at most: replies are FIFO, so when the
    # oldest is late, every later one is too.

    def _waiting_since(self) -> float:
        # The oldest call was written with nothing in flight (at _busy_since), or it
        # became the oldest when a reply arrived (every call in flight then was written
        # before that read), so it has waited since the later of the two.
        sent = self._busy_since
        return sent if sent > self._last_read else self._last_read

    def _arm(self) -> None:
        assert self.read_timeout is not None
        self._timer = self.loop.call_at(self._waiting_since() + self.read_timeout, self._check)

    def _check(self) -> None:
        self._timer = None
        if not self._waiters or self.lost is not None:
            return
        assert self.read_timeout is not None
        timeout = self.read_timeout
        # Timers may fire up to the clock resolution early.
        if self._time() - self._waiting_since() >= timeout - 0.001:
            self.abort(
                lambda: RedisTimeoutError(
                    f"Timeout reading from {self.address}: no reply within {timeout} s "
                    "(the command may or may not have run; the connection was reset)"
                )
            )
        else:
            self._arm()

    # -- failure and closing ------------------------------------------------------------

    def _fail_all(self, make_error: Callable[[], Exception]) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            fut = waiter.future if isinstance(waiter, _Batch) else waiter
            if not fut.done():
                fut.set_exception(make_error())

    def abort(self, make_error: Callable[[], Exception]) -> None:
        """Fail every call in flight with a fresh error each and drop the socket."""
        self.ready = False
        if self.lost is None:
            self.lost = make_error()
        self._fail_all(make_error)
        if self.transport is not None:
            self.transport.abort()

    def abandon(self) -> None:
        """Drop a socket whose event loop is gone (a Broker used from a new loop).

        A closed loop cannot run the transport's close, so the socket is shut
        down (the server drops the client now) and its descriptor is released
        when the transport is garbage-collected.
        """
        self.ready = False
        if self.lost is None:
            self.lost = RedisConnectionError(f"Connection to {self.address} abandoned")
        if self.transport is None:
            return
        try:
            self.transport.abort()
        except RuntimeError:  # "Event loop is closed"
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    async def close(self) -> None:
        """Close the socket (after writing what is buffered) and wait until it is gone."""
        self.ready = False
        if self.lost is None:
            self.lost = RedisConnectionError(f"Connection to {self.address} closed")
            self._fail_all(
                lambda: RedisConnectionError(
                    f"Connection to {self.address} closed by the client "
                    "(the command may or may not have run)"
                )
            )
        if self.transport is not None and not self._closed.done():
            self._out = []  # their callers were just failed: nothing waits for these
            self.transport.close()
            await asyncio.shield(self._closed)


class FastConnection:
    """One pipelined connection to a plain Redis server, connected on first use.

    Commands from concurrent callers share the socket; each gets its own
    reply. Arguments may be bytes, str (UTF-8), int or float. Replies are raw
    (RESP2 over hiredis): bulk strings as bytes, nil as None, error replies
    raised as redis-py's exception types. See the module docstring for the
    failure semantics.
    """

    __slots__ = (
        "__weakref__",  # scripts remember per connection whether the server takes flags
        "_address",
        "_backoff",
        "_closed",
        "_connect_lock",
        "_db",
        "_dial_timeout",
        "_host",
        "_local_socket",
        "_password",
        "_port",
        "_proto",
        "_read_timeout",
        "_retries",
        "_ssl",
        "_tls",
        "_unix_path",
        "_username",
    )

    def __init__(
        self,
        *,
        host: str = "localhost",
        port: int = 6379,
        unix_socket_path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
        dial_timeout: float = 5.0,
        read_timeout: float | None = 3.0,
        retries: int = 3,
        local_socket: bool = False,
    ) -> None:
        if unix_socket_path is not None and tls is not None:
            raise ValueError("TLS is not supported over a unix socket")
        if not dial_timeout > 0:
            raise ValueError(f"dial_timeout must be > 0 seconds, got {dial_timeout}")
        if read_timeout is not None and not read_timeout > 0:
            raise ValueError(f"read_timeout must be > 0 seconds or None, got {read_timeout}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self._host = host
        self._port = port
        self._unix_path = unix_socket_path
        self._db = db
        self._username = username
        self._password = password
        self._tls = tls
        self._ssl: ssl.SSLContext | None = None
        self._dial_timeout = dial_timeout
        self._read_timeout = read_timeout
        self._retries = retries
        self._local_socket = (
            local_socket and unix_socket_path is None and tls is None and host in _LOOPBACK
        )
        # go-redis's backoff between connect attempts, as the redis-py clients use.
        self._backoff = ExponentialWithJitterBackoff(cap=0.512, base=0.008)
        self._address = unix_socket_path if unix_socket_path is not None else f"{host}:{port}"
        self._proto: _Protocol | None = None
        self._connect_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._closed = False

    @classmethod
    def from_options(cls, opts: RedisClientOpts) -> FastConnection:
        """A connection to the server *opts* describe, with its credentials and timeouts."""
        return cls(
            host=opts.host,
            port=opts.port,
            unix_socket_path=opts.unix_socket_path,
            db=opts.db,
            username=opts.username,
            password=opts.password,
            tls=opts.tls,
            dial_timeout=opts.dial_timeout,
            read_timeout=opts.read_timeout,
            retries=opts.retries,
            local_socket=opts.local_socket,
        )

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` ran."""
        return self._closed

    # -- commands -------------------------------------------------------------------------

    def execute_command(self, *args: Any) -> Awaitable[Any]:
        """Send one command; await the result for its reply.

        Returns a future while connected (no coroutine frame on the hot path),
        else a coroutine that connects first.
        """
        try:
            data = _pack(args)
        except TypeError:
            data = _pack(_normalize(args))
        proto = self._proto
        # is_running() rather than get_running_loop(): the latter costs a getpid() syscall.
        if proto is not None and proto.ready and proto.loop.is_running():
            return proto.send(data)
        return self._send_slow(data)

    def send_packed(self, data: bytes) -> Awaitable[Any]:
        """Send one command packed beforehand (:class:`PackedCommand`); await its reply."""
        proto = self._proto
        if proto is not None and proto.ready and proto.loop.is_running():
            return proto.send(data)
        return self._send_slow(data)

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Awaitable[Any]:
        """EVALSHA *sha* (raises NoScriptError when the script is not loaded)."""
        return self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    async def script_load(self, source: str) -> str:
        """SCRIPT LOAD *source*; returns its SHA1 as text."""
        sha: bytes = await self.execute_command("SCRIPT", "LOAD", source)
        return sha.decode()

    async def pipeline(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Send *commands* in one write; one reply per command, error replies as exceptions.

        A lost connection or a read timeout raises for the whole batch (each
        command may or may not have run), as redis-py's pipelines do.
        """
        if not commands:
            return []
        data = b"".join([_pack_command(tuple(cmd)) for cmd in commands])
        proto = await self._writable_proto()
        return await proto.send_batch(data, len(commands))

    async def _send_slow(self, data: bytes) -> Any:
        proto = await self._writable_proto()
        return await proto.send(data)

    async def _writable_proto(self) -> _Protocol:
        while True:
            proto = self._proto
            if proto is None or proto.lost is not None or proto.loop is not _running_loop():
                proto = await self._connect()
            if proto.ready:
                return proto
            await proto.writable()  # then ready, or lost and reconnected on the next turn

    # -- connecting -----------------------------------------------------------------------

    async def _connect(self) -> _Protocol:
        if self._closed:
            raise RedisConnectionError(f"Connection to {self._address} is closed")
        loop = asyncio.get_running_loop()
        if self._connect_lock is None or self._connect_lock[0] is not loop:
            self._connect_lock = (loop, asyncio.Lock())
        async with self._connect_lock[1]:
            proto = self._proto
            if proto is not None and proto.lost is None and proto.loop is loop:
                return proto
            if proto is not None and proto.loop is not loop:
                self._proto = None
                proto.abandon()
            failures = 0
            while True:
                try:
                    proto = await self._dial(loop)
                    break
                except AuthenticationError:
                    raise
                except (OSError, TimeoutError, RedisConnectionError) as exc:
                    failures += 1
                    if failures > self._retries:
                        if isinstance(exc, RedisConnectionError):
                            raise
                        raise RedisConnectionError(
                            f"Error connecting to {self._address}: {exc or type(exc).__name__}"
                        ) from exc
                    await asyncio.sleep(self._backoff.compute(failures))
            if self._closed:  # aclose() ran while we were connecting
                await proto.close()
                raise RedisConnectionError(f"Connection to {self._address} is closed")
            self._proto = proto
            return proto

    async def dial(self, factory: type[_Protocol]) -> _Protocol:
        """A new socket of *factory*'s protocol to the same server, handshake done.

        Not shared with this connection's calls (the Pub/Sub connection uses it);
        the caller closes it. One attempt: the caller retries.
        """
        if self._closed:
            raise RedisConnectionError(f"Connection to {self._address} is closed")
        try:
            return await self._dial(asyncio.get_running_loop(), factory)
        except (OSError, TimeoutError) as exc:
            raise RedisConnectionError(
                f"Error connecting to {self._address}: {exc or type(exc).__name__}"
            ) from exc

    async def _dial(
        self, loop: asyncio.AbstractEventLoop, factory: type[_Protocol] | None = None
    ) -> _Protocol:
        factory = factory or _Protocol
        proto = factory(loop, self._address, self._read_timeout)
        try:
            async with asyncio.timeout(self._dial_timeout):
                if self._unix_path is not None:
                    await loop.create_unix_connection(lambda: proto, self._unix_path)
                else:
                    ctx = self._ssl_context()
                    await loop.create_connection(
                        lambda: proto,
                        self._host,
                        self._port,
                        ssl=ctx,
                        server_hostname=self._host if ctx is not None else None,
                    )
                await self._handshake(proto)
            if self._local_socket:
                proto = await self._prefer_local_socket(loop, proto, factory)
        except BaseException:
            await proto.close()
            raise
        return proto

    async def _prefer_local_socket(
        self, loop: asyncio.AbstractEventLoop, tcp: _Protocol, factory: type[_Protocol]
    ) -> _Protocol:
        """The same server over its unix socket, when it has one this process can open.

        Loopback TCP costs the kernel more per command than a unix socket; a
        local Redis usually listens on both. The socket is used only when it
        leads to the very server *tcp* reached (same ``run_id``); anything
        else (CONFIG refused by an ACL, no socket, no permission, another
        server behind the path) keeps *tcp*. Checked on every (re)connect.
        """
        probe = _pack_command(("CONFIG", "GET", "unixsocket")) + _pack_command(("INFO", "server"))
        config, info = await tcp.send_batch(probe, 2)
        if isinstance(config, Exception) or isinstance(info, Exception):
            return tcp
        path = config[1].decode(errors="replace") if len(config) == 2 else ""
        run_id = _run_id(info)
        if not path or not run_id or not os.access(path, os.R_OK | os.W_OK):
            return tcp
        unix = factory(loop, f"{path} (for {self._address})", self._read_timeout)
        try:
            async with asyncio.timeout(self._dial_timeout):
                await loop.create_unix_connection(lambda: unix, path)
                await self._handshake(unix)
                same = _run_id(await unix.send(_pack_command(("INFO", "server")))) == run_id
        except (OSError, TimeoutError, RedisError):
            same = False
        if not same:
            await unix.close()
            return tcp
        await tcp.close()
        return unix

    def _ssl_context(self) -> ssl.SSLContext | None:
        tls = self._tls
        if tls is None:
            return None
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=tls.ca_certs)
            if tls.certfile is not None:
                ctx.load_cert_chain(tls.certfile, tls.keyfile)
            if not tls.verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl = ctx
        return self._ssl

    async def _handshake(self, proto: _Protocol) -> None:
        """AUTH and SELECT as redis-py does them (RESP2, so no HELLO is needed)."""
        commands: list[tuple[Arg, ...]] = []
        auth: tuple[Arg, ...] | None = None
        if self._username or self._password:
            password = self._password or ""
            auth = ("AUTH", self._username, password) if self._username else ("AUTH", password)
            commands.append(auth)
        if self._db:
            commands.append(("SELECT", self._db))
        if not commands:
            return
        data = b"".join([_pack_command(cmd) for cmd in commands])
        replies = await proto.send_batch(data, len(commands))
        if auth is not None:
            reply = replies.pop(0)
            if isinstance(reply, AuthenticationWrongNumberOfArgsError) and len(auth) == 3:
                # A server before 6.0 takes only a password.
                reply = await proto.send(_pack_command(("AUTH", auth[2])))
                if self._db:
                    replies = [await proto.send(_pack_command(("SELECT", self._db)))]
            if isinstance(reply, Exception):
                raise reply
            if reply != b"OK":
                raise AuthenticationError("Invalid Username or Password")
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    # -- closing --------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the socket (idempotent); calls in flight fail with ConnectionError."""
        self._closed = True
        proto, self._proto = self._proto, None
        if proto is None:
            return
        if proto.loop is _running_loop():
            await proto.close()
        else:
            proto.abandon()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<FastConnection {self._address} db={self._db} {state}>"


_LOOPBACK = frozenset(("localhost", "127.0.0.1", "::1"))


def _run_id(info: Any) -> bytes:
    """The ``run_id`` line of an ``INFO server`` reply (b"" when absent)."""
    if not isinstance(info, bytes):
        return b""
    for line in info.splitlines():
        if line.startswith(b"run_id:"):
            return line[7:].strip()
    return b""


def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()
