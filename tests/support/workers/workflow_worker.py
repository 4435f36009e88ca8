"""A worker process for the workflow crash tests.

    python tests/support/workers/workflow_worker.py REDIS_URL [option=value ...]

Options (seconds as floats): concurrency, lease, heartbeat, recoverer_interval,
recoverer_cutoff, task_check, delayed_check, shutdown_timeout.

Handlers record in Redis what happened, so the test can check it after a kill:
``wf:step`` and ``wf:member`` RPUSH ``<id> <pid>`` on ``asyncq-test:wf:starts``,
sleep (payload = milliseconds, when the payload is a number), write their payload
as their result and HINCRBY ``asyncq-test:wf:done <id>``; ``wf:callback`` RPUSHes
``<workflow id> <task id> <pid> <number of results>`` on ``asyncq-test:wf:callbacks``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import structlog
from redis.asyncio import Redis

from asyncq import Intervals, ServeMux, Server, Task, group_results
from tests.support.workers.options import server_options

STARTS = "asyncq-test:wf:starts"
DONE = "asyncq-test:wf:done"
CALLBACKS = "asyncq-test:wf:callbacks"


async def main(url: str, raw: dict[str, str]) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
    )
    redis = Redis.from_url(url)
    pid = str(os.getpid())
    mux = ServeMux()

    async def work(task: Task) -> None:
        await redis.rpush(STARTS, f"{task.id} {pid}")
        payload = task.payload or b""
        if payload.isdigit():
            await asyncio.sleep(int(payload) / 1000)
        assert task.result_writer is not None
        await task.result_writer.write(payload or b"0")
        await redis.hincrby(DONE, task.id or "", 1)

    async def callback(task: Task) -> None:
        payload = task.payload or b""
        # after a chain step: that step's result; after a group: the group's results
        count = 1 if payload.isdigit() else len(group_results(payload))
        wid = task.headers.get("asyncq-workflow", "")
        await redis.rpush(CALLBACKS, f"{wid} {task.id} {pid} {count}")

    mux.handle("wf:step", work)
    mux.handle("wf:member", work)
    mux.handle("wf:callback", callback)
    options, intervals, rest = server_options(raw)
    if rest:
        raise SystemExit(f"unknown option {next(iter(rest))!r}")
    server = Server(redis, **options, intervals=Intervals(**intervals))
    await server.run(mux)
    await redis.aclose()
    print("worker exited cleanly", flush=True)


if __name__ == "__main__":
    url, *rest = sys.argv[1:]
    asyncio.run(main(url, dict(arg.split("=", 1) for arg in rest)))
