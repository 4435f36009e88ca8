"""Shutdown as asynq does it: stop fetching, wait, requeue to the front, clear state;
and the signals of ``Server.run`` in a real subprocess."""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import Aggregation, Intervals
from asyncq import _keys as keys
from asyncq._producer.client import Client
from asyncq._worker.server import Server
from asyncq.mux import ServeMux
from asyncq.proto.asynq import ServerInfo
from asyncq.task import Task
from tests.support.procs import (
    FAST,
    list_ids,
    spawn,
    stop_process,
    task_hash,
    wait_for_line,
    wait_until,
)
from tests.support.workers.worker import DONE, STARTS

pytestmark = pytest.mark.subprocess

Q = "default"
READY = "send signal TERM or INT"


async def test_unfinished_task_is_requeued_to_the_front_unchanged(
    redis: Redis, client: Client
) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow(task: Task) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    mux = ServeMux()
    mux.handle("slow", slow)
    server = Server(
        redis, concurrency=1, **{**FAST, "shutdown_timeout": timedelta(milliseconds=300)}
    )
    await server.start(mux)
    a = await client.enqueue(Task("slow", b"A"), max_retry=5)
    await asyncio.wait_for(started.wait(), 10)
    original = (await task_hash(redis, Q, a.id))[b"msg"]
    b = await client.enqueue(Task("fast", b"B"))
    await server.shutdown()
    assert cancelled.is_set()
    assert server.stats.requeued == 1
    # Requeued with RPUSH: at the tail, which is where workers take from.
    assert await list_ids(redis, keys.pending_key(Q)) == [b.id, a.id]
    h = await task_hash(redis, Q, a.id)
    assert h[b"state"] == b"pending"
    assert h[b"msg"] == original  # no retry counted, no error recorded
    assert await redis.llen(keys.active_key(Q)) == 0
    assert await redis.zcard(keys.lease_key(Q)) == 0
    assert not await redis.exists(keys.processed_total_key(Q))
    assert not await redis.exists(keys.server_info_key(server.host, server.pid, server.server_id))

    # The next server runs the requeued task first, with its retry count unchanged.
    order: list[tuple[str, int]] = []

    async def record(task: Task) -> None:
        order.append((task.id or "", task.retry_count))

    mux2 = ServeMux()
    mux2.handle("slow", record)
    mux2.handle("fast", record)
    async with Server(redis, concurrency=1, **FAST) as second:
        await second.start(mux2)
        await wait_until(lambda: len(order) == 2, what="both tasks")
    assert order == [(a.id, 0), (b.id, 0)]


async def test_handlers_finishing_within_the_timeout_complete_normally(
    redis: Redis, client: Client
) -> None:
    started = asyncio.Event()

    async def short(task: Task) -> None:
        started.set()
        await asyncio.sleep(0.3)

    mux = ServeMux()
    mux.handle("short", short)
    server = Server(redis, **{**FAST, "shutdown_timeout": timedelta(seconds=10)})
    await server.start(mux)
    info = await client.enqueue(Task("short"))
    await asyncio.wait_for(started.wait(), 10)
    await server.shutdown()
    assert server.stats.requeued == 0
    assert not await redis.exists(keys.task_key(Q, info.id))
    assert await redis.get(keys.processed_total_key(Q)) == b"1"


async def test_idle_shutdown_returns_promptly(redis: Redis) -> None:
    # Long intervals everywhere: shutdown must not wait for any of them.
    server = Server(
        redis,
        intervals=Intervals(
            task_check=timedelta(hours=1),
            delayed_task_check=timedelta(hours=1),
            janitor=timedelta(hours=1),
            recoverer=timedelta(hours=1),
            heartbeat=timedelta(hours=1),
            health_check=timedelta(hours=1),
        ),
        aggregation=Aggregation(aggregator=lambda g, ts: Task("x")),
        lease_duration=timedelta(hours=2),
        health_check=lambda exc: None,
    )
    server.syncer.interval = 3600.0
    await server.start(ServeMux())
    await asyncio.wait_for(server.shutdown(), 5)
    assert server.state == "closed"


@pytest.mark.slow
async def test_sigtstp_stops_fetching_then_sigterm_shuts_down(redis_url: str, redis: Redis) -> None:
    proc = spawn("worker.py", redis_url, "concurrency=2", "shutdown_timeout=10", "heartbeat=0.2")
    try:
        await wait_for_line(proc, READY)
        async with Client(redis) as client:
            running = await client.enqueue(Task("work", b"1500"))

            async def started() -> bool:
                return await redis.llen(STARTS) == 1

            await wait_until(started, what="first task started")
            proc.send_signal(signal.SIGTSTP)

            async def stopped() -> bool:
                for member in await redis.zrange(keys.ALL_SERVERS, 0, -1):
                    data = await redis.get(member)
                    if data is not None and ServerInfo.parse(data).status == "stopped":
                        return True
                return False

            await wait_until(stopped, what="heartbeat reports stopped")
            waiting = await client.enqueue(Task("work", b"0"))
            proc.send_signal(signal.SIGTERM)
            await wait_for_line(proc, "worker exited cleanly")
            assert await asyncio.to_thread(proc.wait, 10) == 0
        # The running task finished within the shutdown timeout; the new one never ran.
        assert await redis.hget(DONE, running.id) == b"1"
        assert await redis.llen(STARTS) == 1
        assert await list_ids(redis, keys.pending_key(Q)) == [waiting.id]
        assert await redis.zcard(keys.ALL_SERVERS) == 0
    finally:
        stop_process(proc)


@pytest.mark.slow
async def test_second_sigint_exits_without_waiting(redis_url: str, redis: Redis) -> None:
    proc = spawn("worker.py", redis_url, "concurrency=1", "shutdown_timeout=60")
    try:
        await wait_for_line(proc, READY)
        async with Client(redis) as client:
            info = await client.enqueue(Task("block"))

            async def started() -> bool:
                return await redis.llen(STARTS) == 1

            await wait_until(started, what="blocking task started")
            proc.send_signal(signal.SIGINT)
            await wait_for_line(proc, "waiting for running tasks")
            proc.send_signal(signal.SIGINT)
            await wait_for_line(proc, "worker exited cleanly", within=20)
            assert await asyncio.to_thread(proc.wait, 10) == 0
        # Not requeued: the task comes back through lease recovery.
        assert (await task_hash(redis, Q, info.id))[b"state"] == b"active"
        assert await list_ids(redis, keys.active_key(Q)) == [info.id]
    finally:
        stop_process(proc)
