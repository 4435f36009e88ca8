"""A standalone Prometheus exporter (``asyncq metrics``): asynq's ``tools/metrics_exporter``.

A small asyncio HTTP server, no web framework needed: ``GET /metrics`` reads
every queue through the Inspector and answers the x/metrics families plus the
process and platform collectors; ``GET /`` links to it. Anything else is 404.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from prometheus_client import PlatformCollector, ProcessCollector, registry
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncq import Inspector
from asyncq.metrics._queues import collect_queue_metrics, render

__all__ = ["MetricsExporter"]

_log = structlog.get_logger("asyncq.metrics")
_MAX_HEADER = 16384
_INDEX = (
    b"<html><body><h1>asyncq metrics exporter</h1><a href='/metrics'>/metrics</a></body></html>"
)


class MetricsExporter:
    """Serves ``/metrics`` for the queues of *inspector* on *host*:*port*."""

    def __init__(self, inspector: Inspector, *, host: str = "127.0.0.1", port: int = 9876) -> None:
        self.inspector = inspector
        self.host = host
        self.port = port
        own = registry.CollectorRegistry(auto_describe=False)
        self._extra: list[registry.Collector] = [
            ProcessCollector(registry=own),
            PlatformCollector(registry=own),
        ]
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Start listening; returns the bound port."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def scrape(self) -> bytes:
        """One scrape's body."""
        return render(await collect_queue_metrics(self.inspector), *self._extra)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            if len(head) > _MAX_HEADER:
                await self._send(writer, 431, b"request header too large\n", "text/plain")
                return
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split(" ")
            if len(parts) != 3:
                await self._send(writer, 400, b"bad request\n", "text/plain")
                return
            method, target, _ = parts
            path = target.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                await self._send(writer, 405, b"method not allowed\n", "text/plain")
            elif path == "/metrics":
                try:
                    body = await self.scrape()
                except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                    _log.warning("scrape failed: redis unreachable", error=exc.__class__.__name__)
                    msg = f"redis unreachable: {exc.__class__.__name__}: {exc}\n".encode()
                    await self._send(writer, 503, msg, "text/plain")
                    return
                await self._send(
                    writer, 200, body, "text/plain; version=0.0.4; charset=utf-8", method == "HEAD"
                )
            elif path == "/":
                await self._send(writer, 200, _INDEX, "text/html", method == "HEAD")
            else:
                await self._send(writer, 404, b"not found\n", "text/plain")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str, head: bool = False
    ) -> None:
        reasons = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                   431: "Request Header Fields Too Large", 503: "Service Unavailable"}  # fmt: skip
        header = (
            f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        writer.write(header if head else header + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
