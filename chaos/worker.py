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
  address-space limit; the child dies with MemoryError and the task fails;
* ``chaos:durable`` (:data:`DURABLE`): a durable run of 3 steps, a sleep, a wait for
  the signal :data:`SIGNAL` keyed by the run's id, and a fan-out of 5 steps, each step
  (``chaos:step``, its task id ``<run id>-<index>``) sleeping ``ms`` between its ``S``
  and ``D`` records; its last entry is a local call that writes the run's own ``S`` and
  ``D`` records, and it returns :data:`DURABLE_RESULT` (with the signal's payload 1).

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
DURABLE = "chaos:durable"
SIGNAL = "chaos:go"
DURABLE_RESULT = 64
"""What a durable run returns: its steps' results (0+1+2 + 10+...+14) + the signal's 1."""


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

    from asyncq import App, Intervals, Run, Server, Task, current_task

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    ledger = Redis.from_url(args.ledger)
    pid = os.getpid()
    runs = itertools.count()
    # An App for the durable run and its steps; the other handlers go on its mux.
    app = App(args.redis)
    mux = app.mux

    def payload(task: Task) -> dict[str, Any]:
        data: dict[str, Any] = task.json() if task.payload else {}
        return data

    async def start(task: Task | str) -> str:
        tid = task if isinstance(task, str) else task.id
        run = f"{pid}.{next(runs)}"
        await ledger.rpush(LEDGER, f"S {tid} {run} {pid} {time.time() - args.skew:.6f}")
        return run

    async def finish(task: Task | str, run: str) -> None:
        tid = task if isinstance(task, str) else task.id
        await ledger.rpush(LEDGER, f"D {tid} {run} {pid} {time.time() - args.skew:.6f}")

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

    @app.task(name="chaos:step", retention=timedelta(minutes=10))
    async def step(i: int, ms: int) -> int:
        run = await start(current_task())
        await asyncio.sleep(ms / 1000)
        await finish(current_task(), run)
        return i

    async def mark(run_id: str) -> None:
        # The run's own ledger records: finished, as far as the ledger sees it.
        await finish(run_id, await start(run_id))

    @app.durable(name=DURABLE, retention=timedelta(minutes=10))
    async def durable(run: Run, ms: int) -> int:
        total = 0
        for i in range(3):
            total += await run.step(step, i, ms)
        await run.sleep(timedelta(milliseconds=200))
        got = await run.wait_for(SIGNAL, key=run.id)
        total += sum(await run.gather(*(run.step(step, 10 + i, ms) for i in range(5))))
        await run.call(mark, run.id)
        return total + int(got)

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
        await app.aclose()
        await ledger.aclose()
    print(json.dumps({"pid": pid, "exit": "clean"}), file=sys.stderr)


if __name__ == "__main__":
    main()
