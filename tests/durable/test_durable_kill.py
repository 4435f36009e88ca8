"""Durable runs survive SIGKILLed workers (real subprocesses, a real server): every run
completes with its result, and a step whose result was recorded never runs again; each
step that ran twice is explained by the ledger (it started in a killed worker and its
result was not recorded at the kill).

The default suite runs :data:`RUNS` = 6 runs and 3 kills; ``nox -s durable_kill`` sets
``ASYNCQ_DURABLE_KILL_RUNS=1000`` (kills: one per 40 runs), all runs in flight at once.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import defaultdict

import pytest
from redis.asyncio import Redis

from asyncq import _keys as keys
from tests.support import durable_app as d
from tests.support.procs import drain, spawn, stop_process, wait_for_line, wait_until

READY = "send signal TERM or INT"
RUNS = int(os.environ.get("ASYNCQ_DURABLE_KILL_RUNS", "6"))
KILLS = max(3, RUNS // 40)
CONCURRENCY = min(64, max(8, RUNS // 10))  # worker slots: more runs, more in flight
STEPS = [*range(5), *range(7, 17)]  # record indices: 5 steps, sleep 5, wait 6, fan-out 7-16


async def started_by(redis: Redis) -> dict[str, list[str]]:
    """Each step task's starts, in order: the pids of the workers that started it."""
    out: dict[str, list[str]] = defaultdict(list)
    for entry in await redis.lrange(d.STARTS, 0, -1):
        tid, pid = entry.decode().split()
        out[tid].append(pid)
    return out


async def recorded_steps(redis: Redis, run_ids: list[str]) -> dict[str, set[int]]:
    """Run id -> the indices whose result (or failure) its record holds."""
    async with redis.pipeline(transaction=False) as pipe:
        for run_id in run_ids:
            pipe.hkeys(keys.run_key(d.QUEUE, run_id))
        records = await pipe.execute()
    return {
        run_id: {int(k[2:]) for k in fields if k.startswith((b"r:", b"e:"))}
        for run_id, fields in zip(run_ids, records, strict=True)
    }


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(120 + RUNS)
async def test_runs_complete_across_kills_and_recorded_steps_never_rerun(
    redis: Redis, redis_url: str
) -> None:
    d.app.redis = redis_url
    rng = random.Random(42)
    began = time.monotonic()
    try:
        handles = []
        for n in range(RUNS):
            if n % 2 == 0:  # kept, and taken by the run's wait
                await d.app.signal("crashy", key=str(n), payload=1)
            handles.append(await d.crashy.start(n))
        run_ids = [h.id for h in handles]
        # Kill at random points of the whole load: after this many side effects in all.
        points = sorted(rng.sample(range(1, int(RUNS * len(STEPS) * 0.9)), KILLS))
        killed: list[str] = []  # pids, in order
        recorded_at_kill: dict[str, dict[str, set[int]]] = {}  # pid -> run -> indices
        for point in points:
            worker = spawn("durable_worker.py", redis_url, str(CONCURRENCY))
            try:
                await wait_for_line(worker, READY)
                drain(worker)  # its log must not fill the pipe and block it

                async def progressed(goal: int = point) -> bool:
                    return int(await redis.get(d.RAN_TOTAL) or 0) >= goal

                await wait_until(progressed, within=120, what="steps done before the kill")
                worker.send_signal(signal.SIGKILL)
                await asyncio.to_thread(worker.wait, 10)
            finally:
                stop_process(worker)
            # Nothing writes until the next worker starts: what the records hold now is
            # what was recorded at the kill.
            killed.append(str(worker.pid))
            recorded_at_kill[str(worker.pid)] = await recorded_steps(redis, run_ids)
        last = spawn("durable_worker.py", redis_url, str(CONCURRENCY))
        try:
            await wait_for_line(last, READY)
            drain(last)
            results = [await h.result(timeout=120) for h in handles]
        finally:
            stop_process(last)
        assert results == [156 if n % 2 == 0 else 155 for n in range(RUNS)]

        ran = {k.decode(): int(v) for k, v in (await redis.hgetall(d.RAN)).items()}
        started = await started_by(redis)
        assert len(ran) == RUNS * len(STEPS)
        ledger: list[str] = []
        restarts = duplicates = 0
        for run_id in run_ids:
            for index in STEPS:
                step = f"{run_id}-{index}"
                pids = started[step]
                assert 1 <= ran[step] <= len(pids), (step, ran[step], pids)
                # Recorded at a kill: no worker spawned after that kill started it again.
                first = next(
                    (i for i, pid in enumerate(killed) if index in recorded_at_kill[pid][run_id]),
                    None,
                )
                if first is not None:
                    later = set(killed[first + 1 :]) | {str(last.pid)}
                    assert not later & set(pids), (step, killed[first], pids)
                if len(pids) == 1:
                    continue
                # It started again only because each earlier start was in a worker killed
                # before the step's result was recorded.
                for pid in pids[:-1]:
                    assert pid in recorded_at_kill, (step, pids)
                    assert index not in recorded_at_kill[pid][run_id], (step, pid)
                restarts += 1
                duplicates += ran[step] - 1
                why = ", ".join(f"{pid} killed before its result was recorded" for pid in pids[:-1])
                ledger.append(
                    f"  {step}: started {len(pids)}x ({why}; last {pids[-1]}), "
                    f"side effect {ran[step]}x"
                )
        total = sum(ran.values())
        assert total == RUNS * len(STEPS) + duplicates
        print(
            f"\nkill ledger: {RUNS} runs, {KILLS} kills (at {points} side effects), "
            f"{RUNS * len(STEPS)} steps, {total} side effects, {restarts} steps started again, "
            f"{duplicates} duplicate side effects, all explained; "
            f"{time.monotonic() - began:.1f} s"
        )
        print("\n".join(ledger))
    finally:
        await d.app.aclose()
