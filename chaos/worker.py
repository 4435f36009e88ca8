"""A chaos worker process: an asyncq Server whose handlers write the ledger.

    python -m chaos.worker --redis URL --ledger URL [--concurrency N] [--lease S] ...

Every handler first RPUSHes ``S <task id> <run> <pid> <time>`` on the ledger
list, and a handler that finishes RPUSHes ``D ...`` just before returning
(before asyncq acknowledges the task to Redis). ``<run>`` is unique per run.
Task types:

* ``work``: sleeps ``ms`` milliseconds (JSON payload), then finishes;
* ``exit``: raises SystemExit (a poison pill: the worker must survive it);
* ``block``: blocks the event loop for ``seconds`` with time.sleep, after
  writing ``B <task id> <run> <pid> <time> <seconds>`` so that the runs it
  stalls are explained, then finishes;
* ``memory``: runs a child process that allocates ``mb`` MiB under a smaller
  address-space limit; the child dies with MemoryError and the task fails.

``--skew S`` says the process clock is S seconds ahead (the harness starts it
under libfaketime); ledger times are written in real time. With
``--patch-clock`` (no libfaketime on the machine) the skew is applied here,
to ``time.time`` before asyncq is imported: the clock every asyncq role reads.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import sys
import time
from datetime import timedelta
from typing import Any

LEDGER = "chaos:ledger"


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos.worker")
    p.add_argument("--redis", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--lease", type=float, default=4.0)
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--recoverer", type=float, default=0.5)
    p.add_argument("--cutoff", type=float, default=0.5)
    p.add_argument("--min-replicas", type=int, default=0)
    p.add_argument("--replica-timeout", type=float, default=2.0)
    p.add_argument("--skew", type=float, default=0.0, help="this process's clock offset (s)")
    p.add_argument(
        "--patch-clock", action="store_true", help="apply --skew to time.time (no libfaketime)"
    )
    return p.parse_args()


def main() -> None:
    args = _parse()
    if args.skew and args.patch_clock:
        real = time.time
        time.time = lambda: real() + args.skew
    asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> None:
    import structlog
    from redis.asyncio import Redis

    from asyncq import Intervals, ServeMux, Server, Task

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    ledger = Redis.from_url(args.ledger)
    pid = os.getpid()
    runs = itertools.count()
    mux = ServeMux()

    def payload(task: Task) -> dict[str, Any]:
        data: dict[str, Any] = task.json() if task.payload else {}
        return data

    async def start(task: Task) -> str:
        run = f"{pid}.{next(runs)}"
        await ledger.rpush(LEDGER, f"S {task.id} {run} {pid} {time.time() - args.skew:.6f}")
        return run

    async def finish(task: Task, run: str) -> None:
        await ledger.rpush(LEDGER, f"D {task.id} {run} {pid} {time.time() - args.skew:.6f}")

    @mux.handler("work")
    async def work(task: Task) -> None:
        run = await start(task)
        await asyncio.sleep(payload(task).get("ms", 0) / 1000)
        await finish(task, run)

    @mux.handler("exit")
    async def exit_(task: Task) -> None:
        await start(task)
        raise SystemExit(3)

    @mux.handler("block")
    async def block(task: Task) -> None:
        run = await start(task)
        seconds = float(payload(task).get("seconds", 1))
        now = time.time() - args.skew
        await ledger.rpush(LEDGER, f"B {task.id} {run} {pid} {now:.6f} {seconds}")
        time.sleep(seconds)  # noqa: ASYNC251 - the point: the whole loop stalls
        await finish(task, run)

    @mux.handler("memory")
    async def memory(task: Task) -> None:
        await start(task)
        mb = int(payload(task).get("mb", 512))
        limit = 128 * 1024 * 1024
        code = (
            "import resource,sys;"
            f"resource.setrlimit(resource.RLIMIT_AS,({limit},{limit}));"
            f"b=bytearray({mb}*1024*1024);sys.exit(0)"
        )
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        rc = await child.wait()
        raise RuntimeError(f"child exceeded its {limit >> 20} MiB memory limit (exit {rc})")

    server = Server(
        args.redis,
        concurrency=args.concurrency,
        lease_duration=timedelta(seconds=args.lease),
        intervals=Intervals(
            heartbeat=timedelta(seconds=args.heartbeat),
            recoverer=timedelta(seconds=args.recoverer),
            recoverer_cutoff=timedelta(seconds=args.cutoff),
            task_check=timedelta(milliseconds=200),
            delayed_task_check=timedelta(milliseconds=200),
        ),
        shutdown_timeout=timedelta(seconds=3),
        retry_delay=lambda n, exc, task: timedelta(0),
        min_replicas=args.min_replicas,
        replica_timeout=timedelta(seconds=args.replica_timeout),
    )
    server.syncer.interval = 0.2  # writes refused during a fault are retried soon

    async def announce() -> None:
        while server.state != "active":  # noqa: ASYNC110 - the server has no "started" event
            await asyncio.sleep(0.05)
        await ledger.rpush(LEDGER, f"R - - {pid} {time.time() - args.skew:.6f}")

    ready = asyncio.create_task(announce())
    try:
        await server.run(mux)
    finally:
        ready.cancel()
        await ledger.aclose()
    print(json.dumps({"pid": pid, "exit": "clean"}), file=sys.stderr)


if __name__ == "__main__":
    main()
