"""Flow control cost: processing with a concurrency limit set but not reached vs no limit.

``python -m benchmarks.flow [--n 5000] [--rounds 3]`` starts a throwaway
``redis-server`` and, alternating the two modes round after round so both see
the same machine load, drains N no-op tasks with one in-process worker
(concurrency 100) on one queue:

* ``none``: no limit;
* ``limit``: ``queue_concurrency={"bench": 10_000}``, a fleet-wide limit that is
  never reached, so every fetch pays the limit lookup (GET of the stored limit
  and ZCOUNT of the live leases inside the dequeue script) without being held.

It prints tasks/s and Redis CPU microseconds per task (``INFO cpu``) per mode
as the median over the rounds, side by side, and the relative cost.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from typing import Any

MODES = ("none", "limit")
QUEUE = "bench"


async def _cpu(redis: Any) -> float:
    cpu = await redis.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


async def measure(url: str, *, mode: str, n: int) -> dict[str, float]:
    """Drain *n* no-op tasks in *mode*; tasks/s and Redis CPU µs per task."""
    import structlog
    from redis.asyncio import Redis

    from asyncq import Client, ServeMux, Server, Task

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    redis = Redis.from_url(url)
    await redis.flushall()
    async with Client(url) as client:
        for res in await client.enqueue_many([Task("noop", b"") for _ in range(n)], queue=QUEUE):
            if isinstance(res, Exception):
                raise res
    done = 0
    all_done = asyncio.Event()
    mux = ServeMux()

    async def noop(task: Any) -> None:
        nonlocal done
        done += 1
        if done >= n:
            all_done.set()

    mux.handle("noop", noop)
    limits = {QUEUE: 10_000} if mode == "limit" else None
    server = Server(url, concurrency=100, queues={QUEUE: 1}, queue_concurrency=limits)
    cpu0 = await _cpu(redis)
    start = time.perf_counter()
    async with server:
        await server.start(mux)
        await asyncio.wait_for(all_done.wait(), 300)
        elapsed = time.perf_counter() - start
        cpu1 = await _cpu(redis)
        await server.shutdown()
    await redis.aclose()
    return {"tasks_per_s": done / elapsed, "redis_cpu_us_per_task": (cpu1 - cpu0) * 1e6 / done}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_redis() -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (apt-get install redis-server)")
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="asyncq-bench-flow-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("redis-server did not start") from None
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000, help="tasks per drain")
    parser.add_argument("--rounds", type=int, default=3, help="drains per mode, alternated")
    args = parser.parse_args(argv)
    proc, url = _start_redis()
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    try:
        for _ in range(args.rounds):
            for mode in MODES:
                results[mode].append(asyncio.run(measure(url, mode=mode, n=args.n)))
    finally:
        proc.terminate()
        proc.wait(10)
    med = {
        m: {k: statistics.median(r[k] for r in results[m]) for k in results[m][0]} for m in MODES
    }
    print(f"{args.n} no-op tasks, concurrency 100, median of {args.rounds} alternated rounds")
    print(f"{'mode':<8}{'tasks/s':>10}{'Redis CPU µs/task':>20}")
    for m in MODES:
        print(f"{m:<8}{med[m]['tasks_per_s']:>10.0f}{med[m]['redis_cpu_us_per_task']:>20.1f}")
    rate = med["limit"]["tasks_per_s"] / med["none"]["tasks_per_s"] - 1
    cpu = med["limit"]["redis_cpu_us_per_task"] / med["none"]["redis_cpu_us_per_task"] - 1
    print(f"limit vs none: throughput {rate:+.1%}, Redis CPU per task {cpu:+.1%}")


if __name__ == "__main__":
    main()
