"""An idle worker over many queues: key tracking instead of polling, and its fallbacks.

Tasks here are written the way Go asynq writes them (no wake-up message): the
worker learns of them from Redis key-tracking invalidations, or by polling when
tracking is lost or refused. No timing is asserted: each test waits for
observable state.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import pytest
import structlog
from redis.asyncio import Redis

from asyncq import Intervals, Server, Task
from asyncq import _keys as keys
from asyncq.mux import ServeMux
from asyncq.proto.asynq import TaskMessage
from tests.support.acl import temporary_acl_user
from tests.support.helpers import push_go_task
from tests.support.procs import wait_until
from tests.support.redis_server import RedisServer

QUEUES = {f"iq{i:03d}": 1 for i in range(300)}


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def own(own_server: RedisServer) -> AsyncIterator[Redis]:
    redis = Redis(port=own_server.port)
    await redis.flushall()
    try:
        yield redis
    finally:
        await redis.aclose()


@pytest.fixture
def structlog_configured() -> Iterator[None]:
    """asyncq logs through structlog's configuration (which ``capture_logs`` swaps) only
    once structlog was configured; see test_cancel_acl."""
    was_configured = structlog.is_configured()
    structlog.configure()
    yield
    if not was_configured:
        structlog.reset_defaults()


def recording_mux(picked: list[str]) -> ServeMux:
    mux = ServeMux()

    async def handle(task: Task) -> None:
        picked.append(task.id or "")

    mux.handle("t", handle)
    return mux


async def write_go_delayed(redis: Redis, queue: str, task_id: str, state: str, due: float) -> None:
    """A scheduled or retry task as Go asynq writes it: the hash, then one ZADD."""
    msg = TaskMessage(type="t", id=task_id, queue=queue, retry=25, timeout=1800)
    await redis.hset(keys.task_key(queue, task_id), mapping={"msg": bytes(msg), "state": state})
    zset = keys.scheduled_key(queue) if state == "scheduled" else keys.retry_key(queue)
    await redis.zadd(zset, {task_id: int(due)})


async def tracking_clients(redis: Redis) -> list[int]:
    """IDs of the connections with key tracking on (flag ``t`` in CLIENT LIST)."""
    clients = await redis.client_list()
    return [int(c["id"]) for c in clients if "t" in c["flags"]]


async def test_go_style_pending_task_is_picked_up_by_invalidation(
    own: Redis, own_server: RedisServer
) -> None:
    picked: list[str] = []
    server = Server(own_server.url, queues=QUEUES, concurrency=4)
    async with server:
        await server.start(recording_mux(picked))
        await wait_until(lambda: tracking_clients(own), what="a tracking connection")
        await wait_until(lambda: server.stats.empty_fetches >= 1, what="an idle worker")
        await push_go_task(own, "iq150", "go-1")
        await wait_until(lambda: "go-1" in picked, what="the unannounced task")
        assert server.stats.invalidations >= 1  # woken by Redis, not by a message
        assert server.stats.wakeup_messages == 0


async def test_go_style_scheduled_and_retry_tasks_are_forwarded_when_due(
    own: Redis, own_server: RedisServer
) -> None:
    picked: list[str] = []
    server = Server(
        own_server.url,
        queues=QUEUES,
        concurrency=4,
        intervals=Intervals(delayed_task_check=timedelta(milliseconds=200)),
    )
    async with server:
        await server.start(recording_mux(picked))
        await wait_until(lambda: tracking_clients(own), what="a tracking connection")
        due = time.time() + 1
        # In different 200-queue probe chunks of the forwarder's script.
        await write_go_delayed(own, "iq010", "sched-1", "scheduled", due)
        await write_go_delayed(own, "iq250", "retry-1", "retry", due)
        await wait_until(lambda: {"sched-1", "retry-1"} <= set(picked), what="the forwarded tasks")
        assert server.stats.forwarded >= 2


async def test_killed_tracking_connection_falls_back_and_recovers(
    own: Redis, own_server: RedisServer
) -> None:
    picked: list[str] = []
    server = Server(own_server.url, queues=QUEUES, concurrency=4)
    async with server:
        await server.start(recording_mux(picked))
        await wait_until(lambda: tracking_clients(own), what="a tracking connection")
        (first,) = await tracking_clients(own)
        await own.client_kill_filter(_id=first)
        # Written while the worker has no tracking: polling or the reconnect finds it.
        await push_go_task(own, "iq001", "during-loss")
        await wait_until(lambda: "during-loss" in picked, what="the task written meanwhile")

        async def tracking_again() -> bool:
            now = await tracking_clients(own)
            return bool(now) and now != [first]

        await wait_until(tracking_again, what="tracking turned on again")
        await wait_until(lambda: server.stats.empty_fetches >= 1, what="an idle worker")
        before = server.stats.invalidations
        await push_go_task(own, "iq299", "after-recovery")
        await wait_until(lambda: "after-recovery" in picked, what="the task written after")
        await wait_until(lambda: server.stats.invalidations > before, what="an invalidation")


async def test_unpausing_a_queue_wakes_the_worker(own: Redis, own_server: RedisServer) -> None:
    picked: list[str] = []
    await own.set(keys.paused_key("iq007"), int(time.time()))
    server = Server(own_server.url, queues=QUEUES, concurrency=4)
    async with server:
        await server.start(recording_mux(picked))
        await wait_until(lambda: tracking_clients(own), what="a tracking connection")
        await wait_until(lambda: server.stats.empty_fetches >= 1, what="an idle worker")
        fetches = server.stats.empty_fetches
        await push_go_task(own, "iq007", "paused-task")
        await wait_until(lambda: server.stats.empty_fetches > fetches, what="a fetch past it")
        assert picked == []
        before = server.stats.invalidations
        await own.delete(keys.paused_key("iq007"))
        await wait_until(lambda: "paused-task" in picked, what="the task of the resumed queue")
        assert server.stats.invalidations > before


@pytest.mark.usefixtures("structlog_configured")
async def test_refused_tracking_falls_back_to_polling(own: Redis, own_server: RedisServer) -> None:
    picked: list[str] = []
    async with temporary_acl_user(
        own, own_server.url, "notrack", "~*", "&*", "+@all", "-client"
    ) as url:
        with structlog.testing.capture_logs() as logs:
            server = Server(url, queues=QUEUES, concurrency=4)
            async with server:
                await server.start(recording_mux(picked))
                await wait_until(
                    lambda: any("key tracking" in e["event"] for e in logs),
                    what="the fallback log line",
                )
                await push_go_task(own, "iq100", "polled")
                await wait_until(lambda: "polled" in picked, what="the polled task")
                assert server.stats.invalidations == 0
                assert await tracking_clients(own) == []
    (line,) = [e for e in logs if "key tracking" in e["event"]]
    assert line["log_level"] == "warning" and "polling" in line["event"]


async def test_queues_matching_a_pattern_later_are_tracked(
    own: Redis, own_server: RedisServer
) -> None:
    picked: list[str] = []
    server = Server(
        own_server.url,
        queues={"tenant:*": 1},
        concurrency=4,
        intervals=Intervals(queue_refresh=timedelta(milliseconds=100)),
    )
    async with server:
        await server.start(recording_mux(picked))  # matching no queue yet: nothing tracked
        await own.sadd(keys.ALL_QUEUES, "tenant:a")
        await push_go_task(own, "tenant:a", "first")
        await wait_until(lambda: "first" in picked, what="the new queue's task")

        async def tracked() -> bool:
            clients = await own.client_list()
            return any("t" in c["flags"] for c in clients)

        await wait_until(tracked, what="the new queue tracked")
        await wait_until(lambda: server.stats.empty_fetches >= 1, what="an idle worker")
        before = server.stats.invalidations
        await push_go_task(own, "tenant:a", "second")
        await wait_until(lambda: "second" in picked, what="the second task")
        await wait_until(lambda: server.stats.invalidations > before, what="an invalidation")
