"""What a durable step costs beside a plain task: Redis commands and worker CPU per step.

    python -m benchmarks.durable_cost                  # throwaway redis-server, N=200 K=5
    python -m benchmarks.durable_cost --n 100 --k 10 --rounds 3
    python -m benchmarks.durable_cost --url redis://127.0.0.1:6379/15   # FLUSHES that db

Two variants of the same step handler (``inc(x) -> x + 1``, a typed task with a
result), in interleaved rounds:

- ``durable``: N runs of a durable function awaiting K steps one after the other
  (``x = await run.step(inc, x)``), started with ``.start()``;
- ``plain``: N*K plain ``inc`` tasks, enqueued one ``.enqueue()`` each.

Each round enqueues first, then starts one in-process worker (concurrency 100) and
waits until the work is done (every run returned, or every task ran) and the queue's
active list is empty (the last acknowledgements). Per step (the plain variant's per
task):

- Redis commands: ``INFO commandstats`` calls after the round minus before it (so
  enqueueing, every command a script runs and the worker's own background commands
  are counted; ``evalsha`` is the number of script calls), divided by N*K;
- worker CPU: ``time.process_time()`` of this process from the worker's start to the
  end of the work, divided by N*K (the enqueueing is not in it).

The median round of each figure is printed, with the durable/plain ratio, then the
commands per step by name (the round of median total).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import timedelta

from redis.asyncio import Redis

from asyncq import App, Run
from asyncq.testing import RedisServerProcess
from benchmarks.workflows import commands, used

QUEUE = "bench"

app = App("redis://localhost:6379/0")
state = {"ran": 0, "ended": 0, "target": 0}
counted = {"name": "ran"}  # the counter that ends the round: "ended" (runs) or "ran" (tasks)
finished = asyncio.Event()


def _tick(key: str) -> None:
    state[key] += 1
    if key == counted["name"] and state[key] == state["target"]:
        finished.set()


@app.task(name="bench:inc", queue=QUEUE)
async def inc(x: int) -> int:
    _tick("ran")
    return x + 1


@app.durable(name="bench:chain", queue=QUEUE)
async def chain(run: Run, k: int) -> int:
    x = 0
    for _ in range(k):
        x = await run.step(inc, x)
    _tick("ended")
    return x


async def one_round(redis: Redis, variant: str, n: int, k: int) -> tuple[dict[str, int], float]:
    """(commands used, worker CPU seconds) of one round of *variant*."""
    await redis.flushdb()
    finished.clear()
    state.update(ran=0, ended=0)
    before = await commands(redis)
    if variant == "durable":
        state["target"] = n
        counter = counted["name"] = "ended"
        await asyncio.gather(*(chain.start(k) for _ in range(n)))
    else:
        state["target"] = n * k
        counter = counted["name"] = "ran"
        await asyncio.gather(*(inc.enqueue(i) for i in range(n * k)))
    server = app.server(queues={QUEUE: 1}, concurrency=100, shutdown_timeout=timedelta(seconds=5))
    cpu = time.process_time()
    await server.start(app.mux)
    await asyncio.wait_for(finished.wait(), 300)
    while await redis.llen(f"asynq:{{{QUEUE}}}:active"):  # noqa: ASYNC110
        await asyncio.sleep(0.001)  # the last acknowledgements
    cpu = time.process_time() - cpu
    await server.shutdown()
    assert state[counter] == state["target"], state
    return used(before, await commands(redis)), cpu


async def main(url: str, n: int, k: int, rounds: int) -> None:
    app.redis = url
    redis = Redis.from_url(url)
    steps = n * k
    cmds: dict[str, list[dict[str, int]]] = {"durable": [], "plain": []}
    cpus: dict[str, list[float]] = {"durable": [], "plain": []}
    for _ in range(rounds):
        for variant, variant_cmds in cmds.items():
            c, cpu = await one_round(redis, variant, n, k)
            variant_cmds.append(c)
            cpus[variant].append(cpu)
    await redis.aclose()
    await app.aclose()
    total = {v: statistics.median(sum(c.values()) / steps for c in cmds[v]) for v in cmds}
    evalsha = {v: statistics.median(c.get("evalsha", 0) / steps for c in cmds[v]) for v in cmds}
    cpu_us = {v: statistics.median(cpus[v]) / steps * 1e6 for v in cmds}
    print(f"N = {n} runs x K = {k} steps ({steps} plain tasks), {rounds} rounds, one worker")
    print(f"{'per step':<10} {'commands':>9} {'evalsha':>8} {'CPU µs':>8}")
    for v in cmds:
        print(f"{v:<10} {total[v]:>9.2f} {evalsha[v]:>8.2f} {cpu_us[v]:>8.0f}")
    print(
        f"{'ratio':<10} {total['durable'] / total['plain']:>9.2f} "
        f"{evalsha['durable'] / evalsha['plain']:>8.2f} "
        f"{cpu_us['durable'] / cpu_us['plain']:>8.2f}"
    )
    print("commands per step, per command (the round of median total)")
    for v, v_cmds in cmds.items():
        runs = sorted(v_cmds, key=lambda c: sum(c.values()))
        mid = runs[len(runs) // 2]
        top = sorted(mid.items(), key=lambda kv: -kv[1])
        print(f"{v:<10} " + " ".join(f"{cmd}={calls / steps:.2f}" for cmd, calls in top))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="durable runs")
    parser.add_argument("--k", type=int, default=5, help="steps per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="Redis URL whose database is FLUSHED")
    args = parser.parse_args()
    if args.url:
        asyncio.run(main(args.url, args.n, args.k, args.rounds))
    else:
        with RedisServerProcess() as redis_server:
            asyncio.run(main(redis_server.url, args.n, args.k, args.rounds))
