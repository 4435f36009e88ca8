"""Cost of the event stream per task: processing with ``events`` off and on, alternately.

    python -m benchmarks.events [--n 20000] [--rounds 3] [--concurrency 100]

Starts a throwaway redis-server, then per round enqueues N no-op tasks and
times one in-process Server draining them (wall time and this process's CPU
time, which is the worker's: the producer is idle meanwhile), once with
``events=False`` and once with ``events=True``, alternating. Prints tasks/s
and CPU microseconds per task (medians) and the relative cost.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from datetime import timedelta

from redis.asyncio import Redis
from redis.exceptions import RedisError

from asyncq import Client, ServeMux, Server, Task
from asyncq import _keys as keys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _noop(task: Task) -> None:
    return None


async def _round(url: str, n: int, concurrency: int, events: bool) -> tuple[float, float]:
    redis = Redis.from_url(url)
    await redis.flushdb()
    async with Client(url) as client:
        for i in range(0, n, 1000):
            await client.enqueue_many([Task("noop") for _ in range(min(1000, n - i))])
    mux = ServeMux()
    mux.handle("noop", _noop)
    server = Server(
        url, concurrency=concurrency, events=events,
        task_check_interval=timedelta(milliseconds=50), shutdown_timeout=timedelta(seconds=5),
    )  # fmt: skip
    wall, cpu = time.perf_counter(), time.process_time()
    await server.start(mux)
    while await redis.llen(keys.pending_key("default")) or await redis.llen(  # noqa: ASYNC110
        keys.active_key("default")
    ):
        await asyncio.sleep(0.01)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await server.shutdown()
    if events:
        assert await redis.xlen("asyncq:events") > 0
    await redis.aclose()
    return n / wall, cpu / n * 1e6


async def main(n: int, rounds: int, concurrency: int) -> None:
    server_bin = shutil.which("redis-server")
    if server_bin is None:
        raise SystemExit("redis-server is not on PATH")
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before the measurements
            [server_bin, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
        )
        try:
            url = f"redis://127.0.0.1:{port}/0"
            for _ in range(100):
                try:
                    await Redis.from_url(url).ping()
                    break
                except (OSError, RedisError):
                    await asyncio.sleep(0.05)
            results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for r in range(rounds):
                for events in (False, True) if r % 2 == 0 else (True, False):
                    rate, cpu = await _round(url, n, concurrency, events)
                    results[events].append((rate, cpu))
                    print(f"round {r + 1} events={'on ' if events else 'off'}: "
                          f"{rate:,.0f} tasks/s, {cpu:.1f} us CPU/task", flush=True)  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(10)
    off_rate = statistics.median(x[0] for x in results[False])
    on_rate = statistics.median(x[0] for x in results[True])
    off_cpu = statistics.median(x[1] for x in results[False])
    on_cpu = statistics.median(x[1] for x in results[True])
    print(f"median off: {off_rate:,.0f} tasks/s, {off_cpu:.1f} us CPU/task")
    print(f"median on:  {on_rate:,.0f} tasks/s, {on_cpu:.1f} us CPU/task")
    print(f"events cost: {(1 - on_rate / off_rate) * 100:.1f} % throughput, "
          f"{(on_cpu / off_cpu - 1) * 100:+.1f} % CPU per task")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.rounds, args.concurrency))
