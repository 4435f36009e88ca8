"""A worker process for the flow-control tests.

    python tests/support/workers/flow_worker.py REDIS_URL [option=value ...]

Options: concurrency, rate (``queue:N/period``, rate_limits), limits
(``queue:N;queue:N``, fleet-wide queue_concurrency), local (the same for
local_queue_concurrency), lease, heartbeat, recoverer_interval, recoverer_cutoff (seconds).

Handlers serve the queue ``limited`` (and ``default``):
``work`` (payload = milliseconds to sleep) INCRs ``asyncq-test:running``,
raises ``asyncq-test:max`` to it if higher, sleeps, DECRs and HINCRBYs
``asyncq-test:done <id>``; ``block`` RPUSHes its id on ``asyncq-test:starts``
and waits until cancelled; ``stamp`` RPUSHes the Redis TIME at its start
(microseconds) on ``asyncq-test:stamps``; ``seq`` (payload ``ok``/``fail``)
sleeps 5 ms, fails its first run when the payload is ``fail``, else RPUSHes
its id on ``asyncq-test:log``; ``tstamp`` does what ``stamp`` does and HSETs
``asyncq-test:retried <id>`` to the task's retry count. Option
``typerate=TYPE:N/period`` sets type_rate_limits. Option ``ordered=Q`` marks Q ordered;
``forward`` sets the forwarder period (seconds); retries wait 0 s.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta
from typing import Any

import structlog
from redis.asyncio import Redis

from asyncq import Intervals, Limits, ServeMux, Server, Task

RUNNING = "asyncq-test:running"
MAX = "asyncq-test:max"
DONE = "asyncq-test:done"
STARTS = "asyncq-test:starts"
STAMPS = "asyncq-test:stamps"
LOG = "asyncq-test:log"
FAILED = "asyncq-test:failed"
RETRIED = "asyncq-test:retried"
_ENTER = """
local n = redis.call("INCR", KEYS[1])
if n > tonumber(redis.call("GET", KEYS[2]) or "0") then
    redis.call("SET", KEYS[2], n)
end
return n
"""


def _limits(text: str) -> dict[str, int]:
    out = {}
    for item in text.split(";"):
        name, _, value = item.partition(":")
        out[name] = int(value)
    return out


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
    mux = ServeMux()

    @mux.handler("work")
    async def work(task: Task) -> None:
        await redis.eval(_ENTER, 2, RUNNING, MAX)
        try:
            await asyncio.sleep(int(task.payload or b"0") / 1000)
        finally:
            await redis.decr(RUNNING)
        await redis.hincrby(DONE, task.id or "", 1)

    @mux.handler("block")
    async def block(task: Task) -> None:
        await redis.rpush(STARTS, task.id or "")
        await asyncio.Event().wait()

    @mux.handler("stamp")
    async def stamp(task: Task) -> None:
        sec, usec = await redis.time()
        await redis.rpush(STAMPS, sec * 1_000_000 + usec)

    @mux.handler("tstamp")
    async def tstamp(task: Task) -> None:
        sec, usec = await redis.time()
        await redis.hset(RETRIED, task.id or "", task.retry_count)
        await redis.rpush(STAMPS, sec * 1_000_000 + usec)

    @mux.handler("seq")
    async def seq(task: Task) -> None:
        await asyncio.sleep(0.005)
        if task.payload == b"fail" and await redis.hsetnx(FAILED, task.id or "", 1):
            raise RuntimeError("injected failure")
        await redis.rpush(LOG, task.id or "")

    options: dict[str, Any] = {"queues": {"limited": 1, "default": 1}}
    intervals: dict[str, Any] = {"task_check": timedelta(milliseconds=50)}
    limits: dict[str, Any] = {}
    durations = {  # option: (where it goes, the Server keyword or the Intervals field)
        "lease": (options, "lease_duration"),
        "heartbeat": (intervals, "heartbeat"),
        "forward": (intervals, "delayed_task_check"),
        "recoverer_interval": (intervals, "recoverer"),
        "recoverer_cutoff": (intervals, "recoverer_cutoff"),
    }
    for key, value in raw.items():
        if key in durations:
            where, name = durations[key]
            where[name] = timedelta(seconds=float(value))
        elif key == "concurrency":
            options["concurrency"] = int(value)
        elif key == "limits":
            limits["queue_concurrency"] = _limits(value)
        elif key == "ordered":
            limits["ordered_queues"] = [value]
            options["retry_delay"] = lambda n, exc, task: timedelta(0)
        elif key == "rate":
            name, _, rate = value.partition(":")
            limits["rate_limits"] = {name: rate}
        elif key == "typerate":
            name, _, rate = value.rpartition(":")
            limits["type_rate_limits"] = {name: rate}
        elif key == "local":
            limits["local_queue_concurrency"] = _limits(value)
        else:
            raise SystemExit(f"unknown option {key!r}")
    server = Server(redis, **options, intervals=Intervals(**intervals), limits=Limits(**limits))
    await server.run(mux)
    await redis.aclose()


if __name__ == "__main__":
    url, *rest = sys.argv[1:]
    asyncio.run(main(url, dict(arg.split("=", 1) for arg in rest)))
