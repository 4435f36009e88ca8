"""The typed API's costs: client CPU per enqueue, and the latency of awaiting a result.

    python -m benchmarks.typed_api                 # throwaway redis-server, 15 rounds of 500
    python -m benchmarks.typed_api --n 500 --url redis://127.0.0.1:6379/15   # FLUSHES that db

1. Client CPU (``time.process_time``) per serial enqueue, each variant in
   many short interleaved rounds; the fastest round of each, which a shared
   machine's load spikes disturb least (the median is printed too):
   ``client.enqueue(Task(type, bytes))``, ``client.enqueue(Task.from_json(...))``,
   ``typed.enqueue(user_id, lang)`` and a typed task taking a pydantic model.
2. Awaiting results, against a worker in another process (``asyncq worker``):
   Redis PING round trip; ``client.wait`` on an already completed task;
   enqueue -> ``await handle.result()`` of a no-op task, woken by the completion
   notification, and the same with the notification ignored (the waiter
   polling every 50 ms, as it does for Go workers).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from asyncq import App, Client, Task
from asyncq._producer.completion import ResultWaiter
from asyncq.testing import RedisServerProcess

ROOT = Path(__file__).resolve().parent.parent

app = App(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))


class Address(BaseModel):
    street: str
    city: str
    zip: str


@app.task(name="bench:welcome")
async def welcome(user_id: int, lang: str = "en") -> None:
    return None


@app.task(name="bench:ship")
async def ship(order_id: int, address: Address) -> None:
    return None


@app.task(name="bench:noop")
async def noop() -> int:
    return 1


BASELINE = "client.enqueue(Task(type, bytes))"
RETAINED = "client.enqueue(Task(type, bytes, retention=5min))"


async def _nothing(*args: object) -> None:
    return None


async def cpu_per_enqueue(
    client: Client, n: int, rounds: int, *, stub_io: bool = False
) -> dict[str, float]:
    """Median client CPU (us) per enqueue; *stub_io*: the broker write is a no-op."""
    if stub_io:
        client = Client(client.redis)
        client.broker.enqueue = _nothing  # type: ignore[method-assign]
    address = Address(street="1 Main St", city="Springfield", zip="12345")
    typed_welcome = welcome.options(client=client)  # as app.client would be: made once
    typed_ship = ship.options(client=client)
    retention = timedelta(minutes=5)
    variants: dict[str, Callable[[int], Awaitable[object]]] = {
        BASELINE: lambda i: client.enqueue(Task("bench:welcome", b'{"user_id":42,"lang":"de"}')),
        RETAINED: lambda i: client.enqueue(
            Task("bench:welcome", b'{"user_id":42,"lang":"de"}', retention=retention)
        ),
        "client.enqueue(Task.from_json(...))": lambda i: client.enqueue(
            Task.from_json("bench:welcome", {"user_id": i, "lang": "de"})
        ),
        "typed welcome.enqueue(i, lang='de')": lambda i: typed_welcome.enqueue(i, lang="de"),
        "typed ship.enqueue(i, Address(...))": lambda i: typed_ship.enqueue(i, address),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():  # warm-up: connections, schema builds
        for i in range(50):
            await fn(i)
    for _ in range(rounds):
        for name, fn in variants.items():
            if not stub_io:
                await client.redis.flushdb()
            start = time.process_time()
            for i in range(n):
                await fn(i)
            samples[name].append((time.process_time() - start) / n * 1e6)
    return {name: min(values) for name, values in samples.items()} | {
        f"{name} [median]": statistics.median(values) for name, values in samples.items()
    }


async def latencies(client: Client, n: int) -> dict[str, tuple[float, float]]:
    def summary(values: list[float]) -> tuple[float, float]:
        values.sort()
        return statistics.median(values) * 1e3, values[int(len(values) * 0.95)] * 1e3

    out: dict[str, tuple[float, float]] = {}
    pings = []
    for _ in range(n):
        start = time.perf_counter()
        await client.redis.ping()
        pings.append(time.perf_counter() - start)
    out["redis PING round trip"] = summary(pings)

    bound = noop.options(client=client)
    done = await bound.enqueue()
    await done.result(timeout=30)
    waits = []
    for _ in range(n):
        start = time.perf_counter()
        await client.wait(done.id, timeout=30)
        waits.append(time.perf_counter() - start)
    out["client.wait() on a completed task"] = summary(waits)

    e2e = []
    for _ in range(n):
        start = time.perf_counter()
        await (await bound.enqueue()).result(timeout=30)
        e2e.append(time.perf_counter() - start)
    out["enqueue + await result() (notification)"] = summary(e2e)

    polling = Client(client.redis)  # a waiter that ignores notifications: polls every 50 ms
    polling._waiter = ResultWaiter(client.redis)
    polling._waiter._pubsub = None
    slow = noop.options(client=polling)
    polled = []
    for _ in range(max(20, n // 10)):
        start = time.perf_counter()
        handle = await slow.enqueue()
        await handle.result(timeout=30, poll_interval=timedelta(milliseconds=50))
        polled.append(time.perf_counter() - start)
    out["enqueue + await result() (50 ms polling only)"] = summary(polled)
    await polling.aclose()
    return out


async def main(url: str, n: int, rounds: int) -> None:
    async with Client(url) as client:
        await client.redis.flushdb()
        for stub_io in (False, True):
            cpu = await cpu_per_enqueue(client, n, rounds, stub_io=stub_io)
            what = "no Redis I/O (broker write stubbed)" if stub_io else "to Redis"
            print(f"client CPU per serial enqueue, {what} (N={n}, best of {rounds} rounds)")
            for name, us in cpu.items():
                if name.endswith("[median]"):
                    continue
                median = cpu[f"{name} [median]"]
                vs = ", ".join(
                    f"{(us / cpu[b] - 1) * 100:+5.1f} % vs {label}"
                    for b, label in ((BASELINE, "Task"), (RETAINED, "Task+retention"))
                )
                print(f"  {name:50s} {us:7.1f} us (median {median:7.1f})  ({vs})")
        await client.redis.flushdb()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_REDIS_URL": url}
        env.pop("ASYNCQ_REDIS_URL", None)
        worker = subprocess.Popen(  # noqa: ASYNC220 - started once, before the measurements
            [sys.executable, "-m", "asyncq.cli", "worker", "benchmarks.typed_api:app", "-c", "8"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            lat = await latencies(client, max(50, n // 10))
        finally:
            worker.terminate()
            worker.wait(30)
        print("result latency (worker in another process; median / p95)")
        for name, (median, p95) in lat.items():
            print(f"  {name:46s} {median:7.2f} ms / {p95:7.2f} ms")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a Redis whose database may be flushed")
    parser.add_argument("--n", type=int, default=500, help="enqueues per round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if args.url:
        asyncio.run(main(args.url, args.n, args.rounds))
        return
    with RedisServerProcess() as server:
        asyncio.run(main(server.url, args.n, args.rounds))


if __name__ == "__main__":
    cli()
