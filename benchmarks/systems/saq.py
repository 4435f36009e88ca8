"""saq 0.26 (Redis queue): ``python -m benchmarks.systems.saq --url redis://...``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from saq import Queue, Worker

from benchmarks.systems._common import Config, Producer, System, main


class SaqProducer(Producer):
    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    async def enqueue(self, i: int) -> None:
        await self.queue.enqueue("noop", i=i)


class Saq(System):
    name = "saq"
    retention = "job record kept 600 s after completion (saq default ttl)"
    distributions = ("saq", "redis")

    @asynccontextmanager
    async def producer(self, cfg: Config) -> AsyncIterator[Producer]:
        queue = Queue.from_url(cfg.url)
        await queue.connect()
        try:
            yield SaqProducer(queue)
        finally:
            await queue.disconnect()

    async def serve(self, cfg: Config, on_task: Callable[[int], None], stop: asyncio.Event) -> None:
        async def noop(ctx: dict[str, Any], *, i: int) -> None:
            on_task(i)

        queue = Queue.from_url(cfg.url)
        await queue.connect()
        worker = Worker(queue, functions=[("noop", noop)], concurrency=cfg.concurrency)
        run = asyncio.create_task(worker.start())
        await stop.wait()
        await worker.stop()
        await run
        await queue.disconnect()


if __name__ == "__main__":
    main(Saq())
