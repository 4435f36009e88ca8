"""Prompt recovery: a SIGKILLed worker's tasks run again within lease duration + 5 s.

The surviving worker's recoverer checks every hour and its forwarder too, so the
only way the killed worker's tasks can come back within the test is the
recoverer's check at the earliest lease expiry it saw plus ``recoverer_cutoff``
(default 2 s), followed by its own forward of the tasks it retried for now (an
expired lease's default retry delay is none). The bound is the recoverer's
schedule: lease expiry (at most the kill plus the lease duration) + the cutoff.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._producer.client import Client
from asyncq.task import Task
from tests.support.procs import spawn, stop_process, stored_message, wait_for_line, wait_until
from tests.support.workers.worker import STARTS

Q = "default"
READY = "send signal TERM or INT"
# A lease is recovered 2 s (the default cutoff) after its expiry: the survivor takes over
# none of the live victim's unless the victim misses 8 heartbeats in a row.
LEASE = 2.0
N = 20
# Neither the forwarder nor the recoverer's regular interval can run in the test's time.
TIMINGS = [f"lease={LEASE}", "heartbeat=0.5", "recoverer_interval=3600", "delayed_check=3600"]


async def starts(redis: Redis) -> list[tuple[str, str]]:
    out = []
    for entry in await redis.lrange(STARTS, 0, -1):
        task_id, pid = entry.decode().split()
        out.append((task_id, pid))
    return out


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(120)
async def test_sigkilled_workers_tasks_run_again_within_lease_plus_5s(
    redis_url: str, redis: Redis
) -> None:
    victim = spawn("worker.py", redis_url, f"concurrency={N}", *TIMINGS)
    survivor = None
    try:
        await wait_for_line(victim, READY)
        async with Client(redis) as client:
            infos = [await client.enqueue(Task("block")) for _ in range(N)]
        ids = {info.id for info in infos}
        victim_pid = str(victim.pid)

        async def victim_holds_all() -> bool:
            return {t for t, pid in await starts(redis) if pid == victim_pid} == ids

        await wait_until(victim_holds_all, within=30, what="the victim runs all 20 tasks")
        survivor = spawn("worker.py", redis_url, f"concurrency={N}", *TIMINGS)
        await wait_for_line(survivor, READY)
        survivor_pid = str(survivor.pid)

        killed_at = time.time()
        victim.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.wait, 10)

        rerun_at: dict[str, float] = {}

        async def all_rerun() -> bool:
            for task_id, pid in await starts(redis):
                if pid == survivor_pid and task_id not in rerun_at:
                    rerun_at[task_id] = time.time()
            return set(rerun_at) == ids

        await wait_until(all_rerun, within=60, interval=0.05, what="every task runs again")
        worst = max(rerun_at.values()) - killed_at
        print(f"\nworst time from SIGKILL to the task running again: {worst:.2f} s")

        for task_id in ids:
            msg = await stored_message(redis, Q, task_id)
            # Stored as asynq's recoverer stores it: one retry used, the lease error.
            assert msg.retried == 1, msg
            assert msg.error_msg == "asynq: task lease expired"
            # last_failed_at is the recoverer's write (whole seconds): within the bound.
            assert msg.last_failed_at <= killed_at + LEASE + 5, (msg.last_failed_at, killed_at)
            assert (await redis.hget(keys.task_key(Q, task_id), "state")) == b"active"
        runs = [t for t, _ in await starts(redis)]
        assert all(runs.count(t) == 2 for t in ids)  # once on each worker, never more
    finally:
        stop_process(victim)
        if survivor is not None:
            stop_process(survivor)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(120)
async def test_a_task_that_kills_every_worker_ends_archived_after_its_retries(
    redis_url: str, redis: Redis
) -> None:
    # Each worker started runs the task and is killed by it; the next one's recoverer
    # retries it (one retry used each time) until none is left, then archives it.
    async with Client(redis) as client:
        info = await client.enqueue(Task("die"), max_retry=2)
    pids: list[str] = []
    while await redis.hget(keys.task_key(Q, info.id), "state") != b"archived":
        assert len(pids) <= 3, f"ran {len(pids)} times without being archived"
        proc = spawn("kamikaze_worker.py", redis_url)
        try:
            await wait_for_line(proc, READY)

            async def ran_or_archived(pid: str = str(proc.pid)) -> bool:
                state = await redis.hget(keys.task_key(Q, info.id), "state")
                return state == b"archived" or any(p == pid for _, p in await starts(redis))

            await wait_until(ran_or_archived, within=60, what="task ran or was archived")
            if proc.pid is not None and any(p == str(proc.pid) for _, p in await starts(redis)):
                await asyncio.to_thread(proc.wait, 10)  # killed by its task
                pids.append(str(proc.pid))
        finally:
            stop_process(proc)
    msg = await stored_message(redis, Q, info.id)
    assert len(pids) == 3  # the first run and two retries
    assert msg.retried == 2 and msg.error_msg == "asynq: task lease expired"
    assert not await redis.lrange(keys.active_key(Q), 0, -1)
    assert not await redis.zrange(keys.lease_key(Q), 0, -1)
