"""Durable runs survive SIGKILLed workers (real subprocesses, a real server): every run
completes with its result, and a step whose result was recorded never runs again; each
step that ran twice is explained by the ledger (it started in a killed worker and its
result was not recorded at the kill)."""

from __future__ import annotations

import asyncio
import random
import signal
from collections import defaultdict

import pytest
from redis.asyncio import Redis

from asyncq import _keys as keys
from tests.support import durable_app as d
from tests.support.procs import spawn, stop_process, wait_for_line, wait_until

READY = "send signal TERM or INT"
RUNS = 6
KILLS = 3
STEPS = 15  # 5 in a row, then a fan-out of 10


async def side_effects(redis: Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await redis.hgetall(d.RAN)).items()}


async def starts(redis: Redis) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for entry in await redis.lrange(d.STARTS, 0, -1):
        tid, pid = entry.decode().split()
        out[tid].append(pid)
    return out


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(120)
async def test_runs_complete_across_kills_and_recorded_steps_never_rerun(
    redis: Redis, redis_url: str
) -> None:
    d.app.redis = redis_url
    rng = random.Random(42)
    try:
        handles = [await d.crashy.start(n) for n in range(RUNS)]
        recorded_at_kill: dict[str, dict[str, set[int]]] = {}  # pid -> run -> indices
        for _ in range(KILLS):
            worker = spawn("durable_worker.py", redis_url)
            try:
                await wait_for_line(worker, READY)
                before = sum((await side_effects(redis)).values())
                goal = before + rng.randint(3, 20)  # kill at a random point of the runs

                async def progressed(goal: int = goal) -> bool:
                    return sum((await side_effects(redis)).values()) >= goal

                await wait_until(progressed, within=60, what="steps done before the kill")
                worker.send_signal(signal.SIGKILL)
                await asyncio.to_thread(worker.wait, 10)
            finally:
                stop_process(worker)
            # Nothing writes until the next worker starts: what the records hold now is
            # what was recorded at the kill.
            recorded: dict[str, set[int]] = {}
            for h in handles:
                record = await redis.hgetall(keys.run_key(d.QUEUE, h.id))
                recorded[h.id] = {int(k[2:]) for k in record if k.startswith((b"r:", b"e:"))}
            recorded_at_kill[str(worker.pid)] = recorded
        last = spawn("durable_worker.py", redis_url)
        try:
            await wait_for_line(last, READY)
            results = [await h.result(timeout=60) for h in handles]
        finally:
            stop_process(last)
        assert results == [155] * RUNS

        ran = await side_effects(redis)
        started = await starts(redis)
        ledger = []
        for h in handles:
            steps = [f"{h.id}-{i}" for i in (*range(5), *range(7, 17))]
            assert all(ran.get(s, 0) >= 1 for s in steps), (h.id, ran)
            for step in steps:
                index = int(step.rsplit("-", 1)[1])
                if ran[step] > 1 or len(started[step]) > 1:
                    # it ran again only because each earlier start was in a worker killed
                    # before the step's result was recorded
                    for pid in started[step][:-1]:
                        assert pid in recorded_at_kill, (step, started[step])
                        assert index not in recorded_at_kill[pid][h.id], (step, pid)
                    ledger.append((step, started[step], ran[step]))
        assert len(ran) == RUNS * STEPS
        print(f"\nkill ledger: {RUNS} runs, {KILLS} kills, {len(ledger)} steps started twice")
        for step, pids, count in ledger:
            print(f"  {step}: started by {pids}, side effect done {count}x")
    finally:
        await d.app.aclose()
