"""A worker process for the signal, crash and aggregation tests.

    python tests/support/workers/worker.py REDIS_URL [option=value ...]

Options (seconds as floats): concurrency, shutdown_timeout, lease, heartbeat,
recoverer_interval, recoverer_cutoff, task_check, delayed_check, retry_delay,
aggregate (``block`` = an aggregator that never returns, ``join`` = one that
joins the payloads), grace, max_size, check_interval.

Handlers record what happened in Redis so the test can check it after a kill:
``work`` (payload = milliseconds to sleep) RPUSHes ``<id> <pid>`` on
``asyncq-test:starts`` before running and HINCRBYs ``asyncq-test:done <id>``
after; ``block`` records its start and waits until cancelled;
``aggregated`` stores its payload in ``asyncq-test:aggregated``.

The server runs through ``Server.run``, so signals behave as in production;
the test waits for the "send signal TERM or INT" log line before signalling.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import structlog
from redis.asyncio import Redis

from asyncq import Aggregation, Intervals, parse_redis_uri
from asyncq._worker.server import Server
from asyncq.mux import ServeMux
from asyncq.task import Task
from tests.support.workers.options import seconds, server_options

STARTS = "asyncq-test:starts"
DONE = "asyncq-test:done"
AGGREGATED = "asyncq-test:aggregated"
AGGREGATING = "asyncq-test:aggregating"


async def main(url: str, raw: dict[str, str]) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
    )
    # A plain URL or a redis-cluster:// one (the Cluster tests kill workers too).
    redis = parse_redis_uri(url).make_client()
    pid = str(os.getpid())
    mux = ServeMux()

    @mux.handler("work")
    async def work(task: Task) -> None:
        await redis.rpush(STARTS, f"{task.id} {pid}")
        await asyncio.sleep(int(task.payload or b"0") / 1000)
        await redis.hincrby(DONE, task.id or "", 1)

    @mux.handler("block")
    async def block(task: Task) -> None:
        await redis.rpush(STARTS, f"{task.id} {pid}")
        await asyncio.Event().wait()

    @mux.handler("aggregated")
    async def aggregated(task: Task) -> None:
        await redis.rpush(AGGREGATED, task.payload or b"")

    options, intervals, rest = server_options(raw)
    aggregation: dict[str, Any] = {}
    for key, value in rest.items():
        if key == "grace":
            aggregation["grace_period"] = seconds(value)
        elif key == "check_interval":
            aggregation["check_interval"] = seconds(value)
        elif key == "max_size":
            aggregation["max_size"] = int(value)
        elif key == "retry_delay":
            delay = seconds(value)
            options["retry_delay"] = lambda n, e, t, d=delay: d
        elif key == "aggregate":
            aggregation["aggregator"] = _aggregator(value, redis)
        else:
            raise SystemExit(f"unknown option {key!r}")
    server = Server(
        redis, **options, intervals=Intervals(**intervals), aggregation=Aggregation(**aggregation)
    )
    await server.run(mux)
    await redis.aclose()
    print("worker exited cleanly", flush=True)


def _aggregator(mode: str, redis: Redis) -> Any:
    async def block(group: str, tasks: Sequence[Task]) -> Task:
        await redis.set(AGGREGATING, len(tasks))
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def join(group: str, tasks: Sequence[Task]) -> Task:
        return Task("aggregated", b",".join(t.payload or b"" for t in tasks))

    return {"block": block, "join": join}[mode]


if __name__ == "__main__":
    url, *rest = sys.argv[1:]
    asyncio.run(main(url, dict(arg.split("=", 1) for arg in rest)))
