"""min_replicas: writes wait for replica acknowledgements (WAIT) on a real master + replica."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import Client, ReplicationTimeoutError, Server, Task
from asyncq import _keys as keys
from asyncq._broker import Broker
from tests.support.procs import FAST, wait_until
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.xdist_group("replication")


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    # No 5 s diskless-sync delay before the replica's first full sync.
    master = RedisServer(extra_args=["--repl-diskless-sync-delay", "0"]).start()
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    try:
        yield master, replica
    finally:
        replica.cleanup()
        master.cleanup()


@pytest.fixture
async def linked(pair: tuple[RedisServer, RedisServer]) -> AsyncIterator[tuple[Redis, Redis]]:
    master, replica = pair
    m, r = Redis.from_url(master.url), Redis.from_url(replica.url)
    await m.flushall()

    async def link_up() -> bool:
        info = await r.info("replication")
        return info.get("master_link_status") == "up"

    await wait_until(link_up, within=20, what="replica link up")
    try:
        yield m, r
    finally:
        await m.aclose()
        await r.aclose()


@pytest.fixture(params=["fast", "redis-py"])
def target(
    request: pytest.FixtureRequest,
    pair: tuple[RedisServer, RedisServer],
    linked: tuple[Redis, Redis],
) -> str | Redis:
    """What a Client is given for the master: its URL (asyncq's own connection) or a
    redis-py client."""
    return pair[0].url if request.param == "fast" else linked[0]


class _Stopped:
    """The replica process paused with SIGSTOP (it cannot acknowledge) while inside."""

    def __init__(self, server: RedisServer) -> None:
        assert server.proc is not None
        self.pid = server.proc.pid

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


async def test_enqueue_returns_once_the_replica_has_the_task(
    linked: tuple[Redis, Redis], target: str | Redis
) -> None:
    _, replica = linked
    async with Client(target, min_replicas=1) as client:
        for n in range(20):
            info = await client.enqueue(Task("t", str(n).encode()))
            # Read straight from the replica: already there when enqueue returned.
            assert await replica.hget(keys.task_key("default", info.id), "state") == b"pending"
        infos = await client.enqueue_many([Task("t", b"x") for _ in range(10)])
        for item in infos:
            assert not isinstance(item, BaseException), item
            assert await replica.exists(keys.task_key("default", item.id)) == 1


async def test_timeout_says_the_write_happened(
    pair: tuple[RedisServer, RedisServer], linked: tuple[Redis, Redis], target: str | Redis
) -> None:
    _, replica_srv = pair
    master, _ = linked
    async with Client(target, min_replicas=1, replica_timeout=timedelta(milliseconds=200)) as c:
        await c.ping()
        with _Stopped(replica_srv):
            with pytest.raises(ReplicationTimeoutError) as caught:
                await c.enqueue(Task("t", b"1"), task_id="held")
            batch = await c.enqueue_many([Task("t", b"2"), Task("t", b"3")])
        err = caught.value
        assert err.written is True
        assert (err.acknowledged, err.required, err.task_id, err.queue) == (0, 1, "held", "default")
        assert "was written on the master" in str(err)
        assert "0 of the 1 required replicas" in str(err)
        # It was written: the master has it, and a retry with the same id says so.
        assert await master.hget(keys.task_key("default", "held"), "state") == b"pending"
        assert all(isinstance(item, ReplicationTimeoutError) for item in batch), batch
        assert await master.llen(keys.pending_key("default")) == 3


async def test_more_replicas_than_exist_times_out(
    pair: tuple[RedisServer, RedisServer], linked: tuple[Redis, Redis]
) -> None:
    async with Client(
        pair[0].url, min_replicas=2, replica_timeout=timedelta(milliseconds=100)
    ) as client:
        with pytest.raises(ReplicationTimeoutError, match="only 1 of the 2 required"):
            await client.enqueue(Task("t"))


async def test_refused_write_raises_its_own_error_not_a_timeout(
    pair: tuple[RedisServer, RedisServer], linked: tuple[Redis, Redis]
) -> None:
    from asyncq import TaskIdConflictError

    async with Client(pair[0].url, min_replicas=1) as client:
        await client.enqueue(Task("t"), task_id="same")
        with pytest.raises(TaskIdConflictError):
            await client.enqueue(Task("t"), task_id="same")


async def test_a_retry_is_told_conflict_only_once_the_first_write_is_replicated(
    pair: tuple[RedisServer, RedisServer], linked: tuple[Redis, Redis], target: str | Redis
) -> None:
    # The first write reached only the master. A retry meeting it must not report
    # "conflict" (it exists) before the replica has it: a failover now would lose it.
    from asyncq import DuplicateTaskError, TaskIdConflictError

    _, replica_srv = pair
    _, replica = linked
    unique = timedelta(hours=1)
    async with Client(target, min_replicas=1, replica_timeout=timedelta(milliseconds=200)) as c:
        await c.ping()
        with _Stopped(replica_srv):
            for _ in range(2):  # the write, then its retry: neither is confirmed
                with pytest.raises(ReplicationTimeoutError) as caught:
                    await c.enqueue(Task("t", b"1"), task_id="held")
                assert (caught.value.task_id, caught.value.queue) == ("held", "default")
            with pytest.raises(ReplicationTimeoutError):
                await c.enqueue(Task("u", b"1"), unique=unique)
            with pytest.raises(ReplicationTimeoutError):
                await c.enqueue(Task("u", b"1"), unique=unique)  # held lock, unconfirmed
            batch = await c.enqueue_many([(Task("t", b"1"), {"task_id": "held"})])
            assert isinstance(batch[0], ReplicationTimeoutError), batch
            assert batch[0].task_id == "held"
        # The replica caught up: the same retries are now refused for what they are.
        with pytest.raises(TaskIdConflictError):
            await c.enqueue(Task("t", b"1"), task_id="held")
        with pytest.raises(DuplicateTaskError):
            await c.enqueue(Task("u", b"1"), unique=unique)
        batch = await c.enqueue_many([(Task("t", b"1"), {"task_id": "held"})])
        assert isinstance(batch[0], TaskIdConflictError), batch
    assert await replica.hget(keys.task_key("default", "held"), "state") == b"pending"


async def test_server_outcome_waits_for_the_replica(
    pair: tuple[RedisServer, RedisServer], linked: tuple[Redis, Redis]
) -> None:
    master, replica = linked
    ran: list[str] = []

    async def handle(task: Task) -> None:
        ran.append(task.id or "")

    async with Client(pair[0].url, min_replicas=1) as client:
        ids = [
            (await client.enqueue(Task("ok"), retention=timedelta(hours=1))).id for _ in range(30)
        ]
    server = Server(pair[0].url, concurrency=4, min_replicas=1, **FAST)
    await server.start(handle)
    try:
        await wait_until(lambda: len(ran) == 30, within=30, what="all tasks run")

        async def replicated() -> bool:
            return await replica.zcard(keys.completed_key("default")) == 30

        await wait_until(replicated, within=10, what="completed on the replica")
    finally:
        await server.shutdown()
    assert sorted(ran) == sorted(ids)
    assert await master.llen(keys.active_key("default")) == 0


async def test_server_logs_an_unconfirmed_outcome_and_keeps_running(
    pair: tuple[RedisServer, RedisServer], linked: tuple[Redis, Redis]
) -> None:
    master, _ = linked
    ran = asyncio.Event()

    async def handle(task: Task) -> None:
        ran.set()

    async with Client(master) as client:
        await client.enqueue(Task("ok"))
    server = Server(
        pair[0].url,
        concurrency=2,
        min_replicas=1,
        replica_timeout=timedelta(milliseconds=100),
        **FAST,
    )
    await server.start(handle)
    try:
        with _Stopped(pair[1]):
            await asyncio.wait_for(ran.wait(), 20)

            async def acked_on_master() -> bool:
                return await master.llen(keys.active_key("default")) == 0

            # The outcome is applied on the master; only its replication is unconfirmed.
            await wait_until(acked_on_master, within=10, what="done on the master")
        assert server.state == "active"
    finally:
        await server.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"min_replicas": -1}, "min_replicas cannot be negative"),
        ({"min_replicas": True}, "min_replicas must be an int"),
        ({"min_replicas": 1, "replica_timeout": 1.0}, "replica_timeout must be a datetime"),
        ({"min_replicas": 1, "replica_timeout": timedelta(0)}, "at least 1 ms"),
    ],
)
def test_bad_options_are_named(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        Client("redis://127.0.0.1:1/0", **kwargs)  # type: ignore[arg-type]
    with pytest.raises((ValueError, TypeError), match=error):
        Server("redis://127.0.0.1:1/0", **kwargs)  # type: ignore[arg-type]


def test_cluster_is_refused_with_a_reason() -> None:
    from redis.asyncio.cluster import RedisCluster

    rc = RedisCluster(host="127.0.0.1", port=1)
    with pytest.raises(ValueError, match="not supported on Redis Cluster"):
        Broker(rc, min_replicas=1)


async def test_durable_hand_offs_go_through_pending_under_min_replicas(
    pair: tuple[RedisServer, RedisServer], linked: tuple[Redis, Redis]
) -> None:
    # A write confirmed by nothing but its reply may come back as an error: neither a
    # run's first step nor the run its step wakes is leased to the worker then.
    from asyncq._broker.durable import FAR_FUTURE, SuspendPlan, suspend_run
    from tests.support import transitions
    from tests.support.durable_scripts import active_run, step_message

    master, _ = linked
    broker = Broker(master, min_replicas=1)
    async with Client(pair[0].url, min_replicas=1) as client:
        run = await active_run(broker, client)
    plan = SuspendPlan("steps", steps=[(0, step_message(0))], waits=[0])
    assert await suspend_run(broker, run, plan, step_here=10.0**10) == "parked"
    assert await master.lrange(keys.pending_key("default"), 0, -1) == [b"r1-0"]
    assert await master.zscore(keys.scheduled_key("default"), "r1") == FAR_FUTURE
    taken = await transitions.dequeue(broker, ["default"])
    assert taken is not None and taken.message.id == "r1-0"
    assert await broker.ack_many([(taken.message, False)], runs_here=lambda q: True) == [None]
    assert await master.lrange(keys.pending_key("default"), 0, -1) == [b"r1"]
