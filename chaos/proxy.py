"""A TCP proxy in front of Redis that can cut one worker off (a network partition).

While partitioned, bytes in both directions are silently dropped and the
sockets stay open, as when a link or a switch dies: the worker sees no error,
only missing replies, until its own timeouts fire. :meth:`heal` closes the
connections that lost bytes (their streams are no longer in step) and lets
new connections through again.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["PartitionProxy"]


class PartitionProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.port = 0
        self.partitioned = False
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tainted: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    async def start(self) -> PartitionProxy:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def partition(self) -> None:
        self.partitioned = True
        self._tainted |= self._links

    def heal(self) -> None:
        self.partitioned = False
        for link in self._tainted:
            for writer in link:
                writer.close()
        self._tainted.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.close()
            return
        link = (writer, up_writer)
        self._links.add(link)
        if self.partitioned:
            self._tainted.add(link)
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, link), self._pump(up_reader, writer, link)
            )
        finally:
            self._links.discard(link)
            self._tainted.discard(link)
            for w in link:
                w.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if self.partitioned or link in self._tainted:
                    continue  # dropped on the floor
                writer.write(data)
                await writer.drain()
        for w in link:
            w.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            for w in link:
                w.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
