"""BullMQ for Python 3.4 (the official port): ``python -m benchmarks.systems.bullmq --url redis://...``.

Its idiomatic API with its defaults: ``Queue(name, {"connection": url})`` and
``await queue.add("noop", {"i": i})`` to enqueue, ``queue.addBulk(...)`` (one
MULTI/EXEC pipeline) as the batch path, and ``Worker(name, processor,
{"connection": url, "concurrency": 100})`` to process. BullMQ keeps every completed
job (``removeOnComplete`` is off by default), which shows in the leftovers rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from bullmq import Queue, Worker

from benchmarks.systems._common import Config, Producer, System, main

QUEUE = "bench"


class BullmqProducer(Producer):
    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    async def enqueue(self, i: int) -> None:
        await self.queue.add("noop", {"i": i})

    async def enqueue_fast(self, indices: Sequence[int], cfg: Config) -> int:
        size = cfg.batch_size or len(indices)
        for start in range(0, len(indices), size):
            await self.queue.addBulk(
                [{"name": "noop", "data": {"i": i}} for i in indices[start : start + size]]
            )
        return 0


class Bullmq(System):
    name = "bullmq"
    fast_path = "Queue.addBulk() (one MULTI/EXEC pipeline per batch)"
    retention = "every completed job kept, without TTL (removeOnComplete off by default)"
    distributions = ("bullmq", "redis")

    @asynccontextmanager
    async def producer(self, cfg: Config) -> AsyncIterator[Producer]:
        queue = Queue(QUEUE, {"connection": cfg.url})
        try:
            yield BullmqProducer(queue)
        finally:
            await queue.close()

    async def serve(self, cfg: Config, on_task: Callable[[int], None], stop: asyncio.Event) -> None:
        async def process(job: Any, token: str) -> None:
            on_task(job.data["i"])

        # autorun off and run() awaited here, so that shutting down also waits for the loop
        worker = Worker(
            QUEUE,
            process,
            {"connection": cfg.url, "concurrency": cfg.concurrency, "autorun": False},
        )
        run = asyncio.create_task(worker.run())
        await stop.wait()
        await worker.close()
        await run


if __name__ == "__main__":
    main(Bullmq())
