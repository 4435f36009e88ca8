"""taskiq 0.13 + taskiq-redis 1.2 (RedisStreamBroker + RedisAsyncResultBackend).

``python -m benchmarks.systems.taskiq --url redis://...``. The consumer group is
created at stream id ``0`` (taskiq-redis defaults to ``$``), so a worker that
starts after the tasks were enqueued still receives them: the processing phase
pre-enqueues its backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from taskiq.api import run_receiver_task
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from benchmarks.systems._common import Config, Producer, System, main

RESULT_TTL_S = 600


def make_broker(url: str) -> RedisStreamBroker:
    backend: RedisAsyncResultBackend[Any] = RedisAsyncResultBackend(
        url, result_ex_time=RESULT_TTL_S
    )
    return RedisStreamBroker(url, consumer_id="0").with_result_backend(backend)


class TaskiqProducer(Producer):
    def __init__(self, noop: Any) -> None:
        self.noop = noop

    async def enqueue(self, i: int) -> None:
        await self.noop.kiq(i)


class Taskiq(System):
    name = "taskiq"
    retention = f"result kept {RESULT_TTL_S} s (result_ex_time); stream entries never trimmed"
    distributions = ("taskiq", "taskiq-redis", "redis")

    @asynccontextmanager
    async def producer(self, cfg: Config) -> AsyncIterator[Producer]:
        broker = make_broker(cfg.url)

        @broker.task(task_name="noop")
        async def noop(i: int) -> None:
            raise AssertionError("the producer never runs tasks")

        await broker.startup()
        try:
            yield TaskiqProducer(noop)
        finally:
            await broker.shutdown()

    async def serve(self, cfg: Config, on_task: Callable[[int], None], stop: asyncio.Event) -> None:
        broker = make_broker(cfg.url)

        @broker.task(task_name="noop")
        async def noop(i: int) -> None:
            on_task(i)

        broker.is_worker_process = True
        run = asyncio.create_task(
            run_receiver_task(broker, max_async_tasks=cfg.concurrency, run_startup=True)
        )
        await stop.wait()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await broker.shutdown()


if __name__ == "__main__":
    main(Taskiq())
