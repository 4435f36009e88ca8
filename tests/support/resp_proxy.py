"""A TCP proxy in front of Redis that counts the commands clients send through it.

``INFO commandstats`` also counts the commands a Lua script runs inside Redis;
this counts only what crosses the network: each top-level RESP array a client
writes is one command (pipelines included).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class _Counter:
    """Counts complete top-level RESP arrays in a byte stream fed in pieces."""

    def __init__(self, on_command: Callable[[], None]) -> None:
        self._buf = bytearray()
        self._on_command = on_command

    def feed(self, data: bytes) -> None:
        self._buf += data
        while True:
            used = self._one(self._buf)
            if used is None:
                return
            del self._buf[:used]
            self._on_command()

    @staticmethod
    def _one(buf: bytearray) -> int | None:
        """Length of the first complete command in *buf*, or None if incomplete."""
        end = buf.find(b"\r\n")
        if end < 0:
            return None
        if buf[:1] != b"*":  # an inline command: one line
            return end + 2
        pos = end + 2
        for _ in range(int(buf[1:end])):
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                return None
            size = int(buf[pos + 1 : line_end])
            pos = line_end + 2 + size + 2
            if pos > len(buf):
                return None
        return pos


class CountingProxy:
    """Listens on a free local port and forwards every connection to *port*."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.commands = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def _count(self) -> None:
        self.commands += 1

    async def __aenter__(self) -> CountingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            counter = _Counter(self._count)
            await asyncio.gather(
                self._pipe(reader, up_writer, counter), self._pipe(up_reader, writer, None)
            )
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counter: _Counter | None
    ) -> None:
        try:
            while data := await reader.read(65536):
                if counter is not None:
                    counter.feed(data)
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(OSError):
                writer.close()
