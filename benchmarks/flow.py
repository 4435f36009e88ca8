"""Flow control cost: processing with a concurrency limit set but not reached vs no limit.

``python -m benchmarks.flow [--n 5000] [--rounds 3]`` starts a throwaway
``redis-server`` and, alternating the two modes round after round so both see
the same machine load, drains N no-op tasks with one in-process worker
(concurrency 100) on one queue:

* ``none``: no limit;
* ``limit``: ``queue_concurrency={"bench": 10_000}``, a fleet-wide limit that is
  never reached, so every fetch pays the limit lookup (GET of the stored limit
  and ZCOUNT of the live leases inside the dequeue script) without being held;
* ``rate``: ``rate_limits={"bench": "10000000/s"}``, a queue rate never reached
  (TIME, HGET, HSET and PEXPIRE of the bucket inside the dequeue script);
* ``typerate``: ``type_rate_limits={"noop": "10000000/s"}``, a task-type rate
  never reached: one more script call (EVALSHA) per task, after the dequeue.

It prints tasks/s and Redis CPU microseconds per task (``INFO cpu``) per mode
as the median over the rounds, side by side, and each mode's cost relative to
``none``. ``--modes`` picks the modes.
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

MODES = ("none", "limit", "rate", "typerate")
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
    rates = {QUEUE: "10000000/s"} if mode == "rate" else None
    type_rates = {"noop": "10000000/s"} if mode == "typerate" else None
    server = Server(
        url,
        concurrency=100,
        queues={QUEUE: 1},
        queue_concurrency=limits,
        rate_limits=rates,
        type_rate_limits=type_rates,
    )
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
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}"
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "none" not in modes or not set(modes) <= set(MODES):
        parser.error(f"--modes must include none and only name {', '.join(MODES)}")
    proc, url = _start_redis()
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    try:
        for _ in range(args.rounds):
            for mode in modes:
                results[mode].append(asyncio.run(measure(url, mode=mode, n=args.n)))
    finally:
        proc.terminate()
        proc.wait(10)
    med = {
        m: {k: statistics.median(r[k] for r in results[m]) for k in results[m][0]} for m in modes
    }
    print(f"{args.n} no-op tasks, concurrency 100, median of {args.rounds} alternated rounds")
    print(f"{'mode':<10}{'tasks/s':>10}{'Redis CPU µs/task':>20}   vs none")
    base = med["none"]
    for m in modes:
        rate = med[m]["tasks_per_s"] / base["tasks_per_s"] - 1
        cpu = med[m]["redis_cpu_us_per_task"] / base["redis_cpu_us_per_task"] - 1
        versus = "" if m == "none" else f"{rate:+.1%} tasks/s, {cpu:+.1%} CPU"
        print(
            f"{m:<10}{med[m]['tasks_per_s']:>10.0f}"
            f"{med[m]['redis_cpu_us_per_task']:>20.1f}   {versus}"
        )


if __name__ == "__main__":
    main()
