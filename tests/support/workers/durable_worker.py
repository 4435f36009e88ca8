"""A worker process of the App of tests/support/durable_app.py, for the durable kill test.

    python tests/support/workers/durable_worker.py REDIS_URL [CONCURRENCY]

Short lease and intervals, so a killed worker's tasks are recovered within seconds, and
a retry 0.1 s after a failure (the default waits 15 s and more).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta

import structlog

from asyncq import Intervals
from tests.support import durable_app as d


async def main(url: str, concurrency: int) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
    )
    d.app.redis = url
    await d.app.run_worker(
        queues={d.QUEUE: 1},
        concurrency=concurrency,
        lease_duration=timedelta(seconds=2),
        shutdown_timeout=timedelta(seconds=5),
        retry_delay=lambda n, exc, task: timedelta(milliseconds=100),
        intervals=Intervals(
            task_check=timedelta(milliseconds=100),
            delayed_task_check=timedelta(milliseconds=100),
            heartbeat=timedelta(milliseconds=300),
            recoverer=timedelta(milliseconds=300),
            recoverer_cutoff=timedelta(milliseconds=500),
        ),
    )
    await d.app.aclose()
    print("worker exited cleanly", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8))
