"""A worker whose ``die`` handler SIGKILLs its own process: a task that kills every worker.

    python tests/support/workers/kamikaze_worker.py REDIS_URL

It records each run (``<task id> <pid>`` on ``asyncq-test:starts``) before
dying. Timings are short (lease 2 s, heartbeat 0.3 s, recoverer cutoff 0.5 s:
only one worker runs at a time, and its own recoverer would take its live task
over only after 8 missed heartbeats); the recoverer interval and the forwarder
are an hour, so the task only comes back through prompt recovery. Prints "send
signal TERM or INT" once serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from datetime import timedelta

import structlog
from redis.asyncio import Redis

from asyncq import Intervals, ServeMux, Server, Task

STARTS = "asyncq-test:starts"


async def main(url: str) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
    )
    redis = Redis.from_url(url)
    mux = ServeMux()

    @mux.handler("die")
    async def die(task: Task) -> None:
        await redis.rpush(STARTS, f"{task.id} {os.getpid()}")
        os.kill(os.getpid(), signal.SIGKILL)

    server = Server(
        url,
        concurrency=1,
        lease_duration=timedelta(seconds=2),
        intervals=Intervals(
            heartbeat=timedelta(milliseconds=300),
            recoverer=timedelta(hours=1),
            recoverer_cutoff=timedelta(milliseconds=500),
            delayed_task_check=timedelta(hours=1),
            task_check=timedelta(milliseconds=100),
        ),
    )
    try:
        await server.run(mux)
    finally:
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
