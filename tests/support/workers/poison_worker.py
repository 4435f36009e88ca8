"""A worker whose handlers raise BaseExceptions, for the failure-containment tests.

    python tests/support/workers/poison_worker.py REDIS_URL

``poison`` (async) and ``poison_sync`` (a plain ``def``, run in a thread) raise
by payload: ``exit`` -> SystemExit, ``interrupt`` -> KeyboardInterrupt,
``generator`` -> GeneratorExit, ``custom`` -> a BaseException subclass. ``ok``
RPUSHes its task id on ``asyncq-test:ok``. The server runs through
``Server.run``; it prints "send signal TERM or INT" once it is serving.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta

import structlog
from redis.asyncio import Redis

from asyncq import Intervals, ServeMux, Server, Task

OK = "asyncq-test:ok"


class Poison(BaseException):
    """Not an Exception: what a careless library might raise."""


def _raise(kind: bytes) -> None:
    if kind == b"exit":
        raise SystemExit(3)
    if kind == b"interrupt":
        raise KeyboardInterrupt
    if kind == b"generator":
        raise GeneratorExit
    raise Poison("custom poison")


async def main(url: str) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(
                colors=False, exception_formatter=structlog.dev.plain_traceback
            ),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
    )
    redis = Redis.from_url(url)
    mux = ServeMux()

    @mux.handler("poison")
    async def poison(task: Task) -> None:
        await asyncio.sleep(0)
        _raise(task.payload or b"")

    @mux.handler("poison_sync")
    def poison_sync(task: Task) -> None:
        _raise(task.payload or b"")

    @mux.handler("ok")
    async def ok(task: Task) -> None:
        await redis.rpush(OK, task.id or "")

    server = Server(
        url,
        concurrency=4,
        retry_delay=lambda n, e, t: timedelta(0),
        intervals=Intervals(
            task_check=timedelta(milliseconds=100),
            delayed_task_check=timedelta(milliseconds=100),
            heartbeat=timedelta(milliseconds=300),
        ),
        shutdown_timeout=timedelta(seconds=2),
    )
    try:
        await server.run(mux)
    finally:
        await redis.aclose()
    print("worker exited cleanly", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
