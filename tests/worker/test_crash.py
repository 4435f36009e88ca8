"""Crash recovery in real subprocesses, and a Redis restart under a running worker."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import defaultdict
from datetime import timedelta

import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from asyncq import Intervals
from asyncq import _keys as keys
from asyncq._producer.client import Client
from asyncq._redis.options import RedisClientOpts
from asyncq._worker.server import Server
from asyncq.mux import ServeMux
from asyncq.task import Task
from tests.support.procs import FAST, spawn, stop_process, wait_for_line, wait_until
from tests.support.redis_server import RedisServer
from tests.support.workers.worker import DONE, STARTS

Q = "default"
READY = "send signal TERM or INT"
TIMINGS = [
    "lease=2",
    "heartbeat=0.3",
    "recoverer_interval=0.3",
    "recoverer_cutoff=0.5",
    "delayed_check=0.2",
    "task_check=0.2",
    "retry_delay=0",
    "shutdown_timeout=5",
]


async def starts_by_pid(redis: Redis) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for entry in await redis.lrange(STARTS, 0, -1):
        task_id, pid = entry.decode().split()
        out[task_id].append(pid)
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.subprocess
async def test_killed_workers_lose_no_task(redis_url: str, redis: Redis) -> None:
    n = 1000
    async with Client(redis) as client:
        infos = await client.enqueue_many([Task("work", b"60") for _ in range(n)])
    ids = {info.id for info in infos}  # type: ignore[union-attr]
    assert len(ids) == n

    survivor = spawn("worker.py", redis_url, "concurrency=4", *TIMINGS)
    killed: set[str] = set()
    victims = []
    try:
        await wait_for_line(survivor, READY)
        for _ in range(3):
            victim = spawn("worker.py", redis_url, "concurrency=16", *TIMINGS)
            victims.append(victim)
            await wait_for_line(victim, READY)
            pid = str(victim.pid)

            async def victim_busy(pid: str = pid) -> bool:
                runs = await starts_by_pid(redis)
                if sum(pids.count(pid) for pids in runs.values()) >= 60:
                    return True
                # On a loaded machine the others may drain the queue before this victim
                # has started 60: then there is nothing left for it to hold, kill it anyway.
                return not await redis.llen(keys.pending_key(Q))

            await wait_until(victim_busy, within=60, what="victim processing")
            victim.send_signal(signal.SIGKILL)
            await asyncio.to_thread(victim.wait, 10)
            killed.add(pid)
        # A last worker that is not killed, to finish faster.
        finisher = spawn("worker.py", redis_url, "concurrency=16", *TIMINGS)
        victims.append(finisher)
        # Signal handlers are installed once it prints READY; a SIGTERM before that kills it.
        await wait_for_line(finisher, READY)

        async def all_done() -> bool:
            return await redis.hlen(DONE) == n and not any(
                [
                    await redis.llen(keys.pending_key(Q)),
                    await redis.llen(keys.active_key(Q)),
                    await redis.zcard(keys.retry_key(Q)),
                    await redis.zcard(keys.scheduled_key(Q)),
                ]
            )

        await wait_until(all_done, within=90, interval=0.1, what="all tasks completed")
        for proc in (survivor, finisher):
            proc.send_signal(signal.SIGTERM)
        for proc in (survivor, finisher):
            assert await asyncio.to_thread(proc.wait, 20) == 0
    finally:
        for proc in (survivor, *victims):
            stop_process(proc)

    done = {k.decode(): int(v) for k, v in (await redis.hgetall(DONE)).items()}
    assert set(done) == ids  # every task completed, none lost
    assert await redis.zcard(keys.archived_key(Q)) == 0
    assert await redis.keys(keys.task_key_prefix(Q) + "*") == []  # done deleted every hash
    runs = await starts_by_pid(redis)
    assert set(runs) == ids
    rerun = 0
    for task_id, pids in runs.items():
        survived = [p for p in pids if p not in killed]
        # At most one run in a process that was not killed; more runs only after kills.
        assert len(survived) <= 1, (task_id, pids, killed)
        if len(pids) > 1:
            rerun += 1
    assert rerun > 0  # the kills did interrupt tasks, which were recovered


@pytest.mark.slow
async def test_redis_restart_worker_reconnects_and_goes_on() -> None:
    rs = RedisServer().start()
    seen: list[str] = []

    async def handle(task: Task) -> None:
        seen.append(task.id or "")

    mux = ServeMux()
    mux.handle("t", handle)
    try:
        server = Server(rs.url, concurrency=4, **FAST)
        await server.start(mux)
        try:
            async with Client(rs.url) as client:
                await client.enqueue_many([Task("t") for _ in range(10)])
            await wait_until(lambda: len(seen) == 10, what="first batch")
            # A task reaches the idle worker by a wake-up message or, with nothing pending,
            # delivered on its delivery channel: both come over the subscriber's connection.
            wakeups_before = server.stats.wakeup_messages + server.stats.delivered

            await asyncio.to_thread(rs.stop)
            outage_start = time.monotonic()
            await wait_until(lambda: server.stats.fetch_errors >= 2, what="fetch errors")
            errors_during_outage = server.stats.fetch_errors
            outage = time.monotonic() - outage_start
            await asyncio.to_thread(rs.start)

            # The worker backs off instead of spinning: at most one fetch per 50 ms.
            assert errors_during_outage <= 2 + outage / 0.05

            async with Client(rs.url) as client:
                later = await client.enqueue_many([Task("t") for _ in range(10)])
                await wait_until(lambda: len(seen) == 20, within=20, what="second batch")
                assert {i.id for i in later} <= set(seen)  # type: ignore[union-attr]

                # The subscriber reconnected too: a wake-up or delivery reaches the idle worker.
                async def woken() -> bool:
                    await client.enqueue(Task("t"))
                    return server.stats.wakeup_messages + server.stats.delivered > wakeups_before

                await wait_until(woken, within=20, interval=0.5, what="wake-up after restart")
        finally:
            await server.shutdown()
    finally:
        rs.cleanup()


async def test_task_finished_during_outage_is_written_by_the_syncer() -> None:
    rs = RedisServer().start()
    release = asyncio.Event()
    started = asyncio.Event()

    async def handle(task: Task) -> None:
        started.set()
        await release.wait()

    mux = ServeMux()
    mux.handle("t", handle)
    try:
        # A short read timeout so the stalled Redis is noticed quickly.
        opts = RedisClientOpts(host="127.0.0.1", port=rs.port, read_timeout=0.3)

        def logged(event: str) -> bool:
            return any(e["event"] == event for e in logs)

        with capture_logs() as logs:  # before the server binds its loggers
            server = Server(opts, concurrency=1, **FAST)
            server.syncer.interval = 0.2  # its first try is an interval after start: not 5 s
            async with server:
                await server.start(mux)
                async with Client(rs.url) as client:
                    info = await client.enqueue(Task("t"))
                await asyncio.wait_for(started.wait(), 10)
                # Make Redis unresponsive while the handler finishes.
                await asyncio.to_thread(rs.proc.send_signal, signal.SIGSTOP)  # type: ignore[union-attr]
                try:
                    release.set()
                    await wait_until(
                        lambda: logged("could not write task outcome; the syncer will retry it"),
                        within=20,
                        what="write queued",
                    )
                finally:
                    await asyncio.to_thread(rs.proc.send_signal, signal.SIGCONT)  # type: ignore[union-attr]
                # Written, not merely taken off the queue (the syncer empties it before it
                # writes): the line is logged once Redis answered the write.
                await wait_until(
                    lambda: logged("task outcome written by the syncer"),
                    within=20,
                    what="syncer flushed",
                )
                assert not server.syncer.pending
                check = Redis.from_url(rs.url)
                try:
                    assert not await check.exists(keys.task_key(Q, info.id))
                    assert await check.get(keys.processed_total_key(Q)) == b"1"
                finally:
                    await check.aclose()
    finally:
        rs.cleanup()


def test_timing_knobs_are_plain_keywords(redis_url: str) -> None:
    server = Server(
        redis_url,
        lease_duration=timedelta(seconds=2),
        intervals=Intervals(
            heartbeat=timedelta(milliseconds=300),
            recoverer=timedelta(milliseconds=300),
            recoverer_cutoff=timedelta(milliseconds=500),
        ),
    )
    cfg = server.config
    assert (cfg.lease_duration, cfg.heartbeat_interval) == (2, 0.3)
    assert (cfg.recoverer_interval, cfg.recoverer_cutoff) == (0.3, 0.5)
