"""arq 0.28: ``python -m benchmarks.systems.arq --url redis://... [--variant poll50]``.

``--variant poll50`` runs the worker with ``poll_delay=0.05`` instead of the default
0.5 s (arq polls its queue sorted set; it has no blocking dequeue).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.worker import Worker, func

from benchmarks.systems._common import Config, Producer, System, main

VARIANTS = {"": 0.5, "poll50": 0.05}


class ArqProducer(Producer):
    def __init__(self, pool: ArqRedis) -> None:
        self.pool = pool

    async def enqueue(self, i: int) -> None:
        if await self.pool.enqueue_job("noop", i) is None:
            raise RuntimeError(f"arq refused to enqueue task {i}")


class Arq(System):
    name = "arq"
    retention = "result kept 3600 s (keep_result default)"
    distributions = ("arq", "redis")

    @asynccontextmanager
    async def producer(self, cfg: Config) -> AsyncIterator[Producer]:
        pool = await create_pool(RedisSettings.from_dsn(cfg.url))
        try:
            yield ArqProducer(pool)
        finally:
            await pool.aclose()

    async def serve(self, cfg: Config, on_task: Callable[[int], None], stop: asyncio.Event) -> None:
        if cfg.variant not in VARIANTS:
            raise ValueError(f"unknown arq variant {cfg.variant!r}; known: {sorted(VARIANTS)}")

        async def noop(ctx: dict[str, Any], i: int) -> None:
            on_task(i)

        worker = Worker(
            functions=[func(noop, name="noop")],
            redis_settings=RedisSettings.from_dsn(cfg.url),
            max_jobs=cfg.concurrency,
            poll_delay=VARIANTS[cfg.variant],
            handle_signals=False,
        )
        run = asyncio.create_task(worker.async_run())
        await stop.wait()
        await worker.close()
        with contextlib.suppress(asyncio.CancelledError):
            await run


if __name__ == "__main__":
    main(Arq())
