"""A 1,000-task group with a callback beside the same fan-out as plain tasks.

    python -m benchmarks.workflows                 # throwaway redis-server, 3 rounds of 1,000
    python -m benchmarks.workflows --n 1000 --rounds 5 --url redis://127.0.0.1:6379/15  # FLUSHES

One in-process worker (concurrency 100) serves no-op handlers. Variants, in
interleaved rounds (the median and fastest round are printed):

- ``plain``: ``client.enqueue_many`` of N tasks; done when all N handlers ran
  and were acknowledged (the queue is empty).
- ``chord``: ``chord([N tasks], callback).enqueue(client)``; done when the
  callback ran. Members are acknowledged in the batches of plain successes
  (``ack_many.lua``), which record them in the workflow and hand off.
- ``chord+results``: the same with each member writing an 8-byte result, which
  the callback receives (``group_results``).

Redis commands per member: the calls of ``INFO commandstats`` before and after
the run (so the commands scripts run count, and the worker's own background
commands, heartbeats and polls, are included), divided by N. ``--breakdown``
prints them per command (median round).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from redis.asyncio import Redis

from asyncq import Client, ServeMux, Server, Task, chord
from asyncq.testing import RedisServerProcess


async def commands(redis: Redis) -> dict[str, int]:
    """Calls per command so far, those run by scripts included."""
    info = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()}


def used(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    out = {name: calls - before.get(name, 0) for name, calls in after.items()}
    out["info"] -= 1  # the reading of *after*
    return {name: calls for name, calls in out.items() if calls}


async def main(url: str, n: int, rounds: int, breakdown: bool) -> None:
    redis = Redis.from_url(url)
    await redis.flushdb()
    done = asyncio.Event()
    count = 0
    # A chord is done when its callback ran, plain fan-out when its N handlers did
    # (a chord's members reaching N must not end a run before its callback).
    counting = False

    async def member(task: Task) -> None:
        nonlocal count
        if task.payload == b"r":
            assert task.result_writer is not None
            await task.result_writer.write(b"12345678")
        count += 1
        if counting and count == n:
            done.set()

    async def callback(task: Task) -> None:
        done.set()

    mux = ServeMux()
    mux.handle("bench:member", member)
    mux.handle("bench:callback", callback)
    server = Server(
        url,
        concurrency=100,
        task_check_interval=timedelta(milliseconds=50),
        shutdown_timeout=timedelta(seconds=5),
    )
    await server.start(mux)

    async def plain(client: Client) -> None:
        await client.enqueue_many([Task("bench:member") for _ in range(n)])

    def chord_of(payload: bytes) -> Callable[[Client], Awaitable[None]]:
        async def go(client: Client) -> None:
            members = [Task("bench:member", payload) for _ in range(n)]
            await chord(members, Task("bench:callback")).enqueue(client)

        return go

    variants: dict[str, Callable[[Client], Awaitable[None]]] = {
        "plain": plain,
        "chord": chord_of(b""),
        "chord+results": chord_of(b"r"),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    cmds: dict[str, list[dict[str, int]]] = {name: [] for name in variants}
    async with Client(redis) as client:
        for _ in range(rounds):
            for name, run in variants.items():
                count = 0
                counting = name == "plain"
                done.clear()
                before = await commands(redis)
                t0 = time.perf_counter()
                await run(client)
                await asyncio.wait_for(done.wait(), 300)
                while await redis.llen("asynq:{default}:active"):  # noqa: ASYNC110
                    await asyncio.sleep(0.001)  # the last acknowledgements
                times[name].append(time.perf_counter() - t0)
                cmds[name].append(used(before, await commands(redis)))
    await server.shutdown()
    await redis.aclose()
    print(f"N = {n}, {rounds} rounds, one worker (concurrency 100)")
    print(f"{'variant':<15} {'median s':>9} {'best s':>8} {'tasks/s':>8} {'cmds/member':>12}")
    for name in variants:
        med = statistics.median(times[name])
        per_member = statistics.median(sum(c.values()) / n for c in cmds[name])
        print(
            f"{name:<15} {med:>9.3f} {min(times[name]):>8.3f} {n / med:>8.0f} {per_member:>12.2f}"
        )
    if breakdown:
        print("commands per member, per command (the round of median total)")
        for name in variants:
            runs = sorted(cmds[name], key=lambda c: sum(c.values()))
            mid = runs[len(runs) // 2]
            top = sorted(mid.items(), key=lambda kv: -kv[1])
            print(f"{name:<15} " + " ".join(f"{cmd}={calls / n:.2f}" for cmd, calls in top))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="Redis URL whose database is FLUSHED")
    parser.add_argument("--breakdown", action="store_true", help="commands per member by name")
    args = parser.parse_args()
    if args.url:
        asyncio.run(main(args.url, args.n, args.rounds, args.breakdown))
    else:
        with RedisServerProcess() as server:
            asyncio.run(main(server.url, args.n, args.rounds, args.breakdown))
