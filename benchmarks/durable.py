"""What a durable step costs beside a plain task and a chain step of the same task.

    python -m benchmarks.durable                    # throwaway redis-server, 5 alternations
    python -m benchmarks.durable --quick            # smoke run: 1 alternation, small batches
    python -m benchmarks.durable --alternations 9 --url redis://127.0.0.1:6379/15  # FLUSHES

One worker subprocess (concurrency 50) serves ``inc(x) -> x + 1``. Three variants, each
doing *batch* × 10 runs of ``inc``, alternated in every round so all three see the same
machine load:

- ``plain``: batch × 10 ``inc`` tasks enqueued at once (``enqueue_many``);
- ``chain``: batch typed chains ``inc.s(0).then(inc)...`` of 10 (results passed on);
- ``durable``: batch runs of a durable function awaiting ``run.step(inc, x)`` 10 times.

Per step (one run of ``inc``), over the window from the enqueue until the queue holds
nothing pending, active, scheduled or retrying:

- Redis commands: ``INFO commandstats`` calls (scripts' commands included, and the
  worker's own background commands) minus the ones this process sent to watch;
- Redis CPU: ``INFO cpu`` ``used_cpu_sys + used_cpu_user`` of the server;
- worker CPU: the worker process's utime + stime (``/proc/<pid>/stat``).

Then the end-to-end time of one unit, serially, *samples* times per round: a plain task
enqueued until its result is read, a chain of 10 and a durable run of 10 steps likewise.
Printed: medians over the rounds, and the ratios durable / plain (per step) and
durable / chain.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
from redis.asyncio import Redis

from asyncq import App, Pipe, Run
from asyncq.testing import RedisServerProcess

QUEUE = "bench-durable"
STEPS = 10
READY = "durable bench worker ready"
ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("plain", "chain", "durable")
METRICS = ("cmds", "redis_us", "worker_us")

app = App(os.environ.get("ASYNCQ_BENCH_URL", "redis://localhost:6379/0"))


@app.task(name="bench:inc", queue=QUEUE)
async def inc(x: int) -> int:
    return x + 1


@app.durable(name="bench:ten", queue=QUEUE)
async def ten(run: Run, x: int) -> int:
    for _ in range(STEPS):
        x = await run.step(inc, x)
    return x


async def serve(url: str) -> None:
    """The worker process: serves the App's queue until SIGTERM (warnings logged only)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    app.redis = url

    async def announce() -> None:
        await asyncio.sleep(0.5)
        print(READY, flush=True)

    ready = asyncio.create_task(announce())
    await app.run_worker(queues={QUEUE: 1}, concurrency=50)
    ready.cancel()
    await app.aclose()


def cpu_seconds(pid: int) -> float:
    """utime + stime of process *pid*, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Probe:
    """Reads the server's counters and counts the commands it sends itself."""

    def __init__(self, redis: Redis, worker: int) -> None:
        self.redis = redis
        self.worker = worker
        self.own: Counter[str] = Counter()

    async def counters(self) -> tuple[Counter[str], float, float]:
        """(calls per command so far, Redis CPU s, worker CPU s); two INFOs of our own."""
        stats = await self.redis.info("commandstats")
        cpu = await self.redis.info("cpu")
        self.own["info"] += 2
        calls = Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})
        redis_cpu = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
        return calls, redis_cpu, cpu_seconds(self.worker)

    async def drained(self) -> None:
        """Wait until the queue holds nothing pending, active, scheduled or retrying."""
        prefix = f"asynq:{{{QUEUE}}}:"
        while True:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.llen(prefix + "pending").llen(prefix + "active")
                pipe.zcard(prefix + "scheduled").zcard(prefix + "retry")
                sizes = await pipe.execute()
            self.own.update(llen=2, zcard=2)
            if not any(sizes):
                return
            await asyncio.sleep(0.02)


def chain_of_ten() -> Pipe[int]:
    p = inc.s(0)
    for _ in range(STEPS - 1):
        p = p.then(inc)
    return p


def variants(batch: int) -> dict[str, Callable[[], Awaitable[object]]]:
    """Each variant's batch (enqueue only) and the unit its end-to-end time waits for."""

    async def plain() -> None:
        await app.client.enqueue_many([inc.to_task(0) for _ in range(batch * STEPS)])

    async def chains() -> None:
        await asyncio.gather(*(chain_of_ten().enqueue() for _ in range(batch)))

    async def durables() -> None:
        await asyncio.gather(*(ten.start(0) for _ in range(batch)))

    return {"plain": plain, "chain": chains, "durable": durables}


async def one(name: str) -> float:
    """The end-to-end time of one unit of *name*, in ms (its result read)."""
    t0 = time.perf_counter()
    if name == "plain":
        assert await (await inc.enqueue(0)).result(timeout=30) == 1
    elif name == "chain":
        assert await (await chain_of_ten().enqueue()).result(timeout=30) == STEPS
    else:
        assert await (await ten.start(0)).result(timeout=30) == STEPS
    return (time.perf_counter() - t0) * 1000


async def measure(
    url: str, worker: int, alternations: int, batch: int, samples: int, *, breakdown: bool
) -> None:
    app.redis = url
    redis = Redis.from_url(url)
    probe = Probe(redis, worker)
    batches = variants(batch)
    cost: dict[str, dict[str, list[float]]] = {v: {m: [] for m in METRICS} for v in VARIANTS}
    by_command: dict[str, Counter[str]] = {}  # the last round's, per variant
    e2e: dict[str, list[float]] = {v: [] for v in VARIANTS}
    steps = batch * STEPS
    for _ in range(alternations):
        for name in VARIANTS:
            c0, r0, w0 = await probe.counters()
            # From here: the first reading's two INFOs (a command is counted after it
            # ran), the polls, not the second reading's INFO commandstats: probe.own.
            probe.own = Counter()
            await batches[name]()
            await probe.drained()
            c1, r1, w1 = await probe.counters()
            # the client's own enqueue commands stay in: they are part of the variant
            by_command[name] = c1 - c0 - probe.own  # Counter subtraction: positive counts
            cost[name]["cmds"].append(by_command[name].total() / steps)
            cost[name]["redis_us"].append((r1 - r0) * 1e6 / steps)
            cost[name]["worker_us"].append((w1 - w0) * 1e6 / steps)
        for name in VARIANTS:
            e2e[name].extend([await one(name) for _ in range(samples)])
    await redis.aclose()
    await app.aclose()
    report(cost, e2e, alternations, batch, samples)
    if breakdown:
        print("commands per step, per command (the last round)")
        for name in VARIANTS:
            top = by_command[name].most_common()
            print(f"{name:<9} " + " ".join(f"{cmd}={calls / steps:.2f}" for cmd, calls in top))


def report(
    cost: dict[str, dict[str, list[float]]],
    e2e: dict[str, list[float]],
    alternations: int,
    batch: int,
    samples: int,
) -> None:
    med = {v: {m: statistics.median(cost[v][m]) for m in METRICS} for v in VARIANTS}
    lat = {v: statistics.median(e2e[v]) for v in VARIANTS}
    print(
        f"{alternations} alternations; per round {batch * STEPS} runs of inc per variant, "
        f"{samples} end-to-end samples each; medians; one worker process (concurrency 50)"
    )
    print(
        f"{'variant':<9} {'cmds/step':>10} {'Redis µs/step':>14} {'worker µs/step':>15} "
        f"{'end-to-end ms':>14}"
    )
    units = {"plain": "1 task", "chain": f"chain of {STEPS}", "durable": f"{STEPS}-step run"}
    for v in VARIANTS:
        m = med[v]
        print(
            f"{v:<9} {m['cmds']:>10.2f} {m['redis_us']:>14.1f} {m['worker_us']:>15.1f} "
            f"{lat[v]:>9.2f} ({units[v]})"
        )
    print("ratios (durable step / plain task; durable / chain):")
    for other, per in (("plain", STEPS), ("chain", 1)):
        cells = " ".join(f"{m}={ratio(med['durable'][m], med[other][m])}" for m in METRICS)
        end = lat["durable"] / (lat[other] * per)
        what = f"end-to-end per step={end:.2f}x" if per > 1 else f"end-to-end={end:.2f}x"
        print(f"  durable / {other:<6} {cells} {what}")


def ratio(a: float, b: float) -> str:
    # A smoke run's worker CPU can be below the clock tick (0): no ratio then.
    return f"{a / b:.2f}x" if b else "n/a"


def run(url: str, alternations: int, batch: int, samples: int, *, breakdown: bool) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.durable", "--serve", url],
        stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        for line in worker.stdout:
            if READY in line:
                break
        else:
            raise SystemExit(f"the worker exited before it was ready (exit {worker.wait()})")
        asyncio.run(measure(url, worker.pid, alternations, batch, samples, breakdown=breakdown))
    finally:
        worker.terminate()
        worker.wait(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alternations", type=int, default=5)
    # 500 units: 5,000 steps a round, so one clock tick of the worker's CPU time (10 ms)
    # is 2 µs a step, not the 5 µs that 200 gave
    parser.add_argument("--batch", type=int, default=500, help="units of 10 per variant/round")
    parser.add_argument("--samples", type=int, default=20, help="end-to-end samples per round")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, small")
    parser.add_argument("--breakdown", action="store_true", help="commands per step by name")
    parser.add_argument("--url", help="Redis URL whose database is FLUSHED")
    parser.add_argument("--serve", metavar="URL", help=argparse.SUPPRESS)  # the worker process
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    if args.quick:
        args.alternations, args.batch, args.samples = 1, 10, 2
    if args.url:
        asyncio.run(_flush(args.url))
        run(args.url, args.alternations, args.batch, args.samples, breakdown=args.breakdown)
    else:
        with RedisServerProcess() as server:
            run(server.url, args.alternations, args.batch, args.samples, breakdown=args.breakdown)


async def _flush(url: str) -> None:
    async with Redis.from_url(url) as redis:
        await redis.flushdb()


if __name__ == "__main__":
    main()
