"""streaq 7.2 (Redis streams, coredis): ``python -m benchmarks.systems.streaq --url redis://...``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from streaq import Worker

from benchmarks.systems._common import Config, Producer, System, main


class StreaqProducer(Producer):
    def __init__(self, worker: Worker[Any], noop: Any) -> None:
        self.worker = worker
        self.noop = noop

    async def enqueue(self, i: int) -> None:
        await self.noop.enqueue(i)

    async def enqueue_fast(self, indices: Sequence[int], cfg: Config) -> int:
        size = cfg.batch_size or len(indices)
        for start in range(0, len(indices), size):
            await self.worker.enqueue_many(
                [self.noop.enqueue(i) for i in indices[start : start + size]]
            )
        return 0


class Streaq(System):
    name = "streaq"
    fast_path = "Worker.enqueue_many() (one pipeline per batch)"
    retention = "result kept 300 s (task ttl default)"
    distributions = ("streaq", "coredis")

    @asynccontextmanager
    async def producer(self, cfg: Config) -> AsyncIterator[Producer]:
        worker: Worker[Any] = Worker(redis_url=cfg.url, concurrency=cfg.concurrency)

        @worker.task(name="noop")
        async def noop(i: int) -> None:
            raise AssertionError("the producer never runs tasks")

        async with worker:
            yield StreaqProducer(worker, noop)

    async def serve(self, cfg: Config, on_task: Callable[[int], None], stop: asyncio.Event) -> None:
        worker: Worker[Any] = Worker(redis_url=cfg.url, concurrency=cfg.concurrency)

        @worker.task(name="noop")
        async def noop(i: int) -> None:
            on_task(i)

        run = asyncio.create_task(worker.run_async())
        await stop.wait()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run


if __name__ == "__main__":
    main(Streaq())
