"""Audit follow-ups: messages naming another (or no) queue are archived at dequeue, a failing later
queue does not lose what dequeue_many already took, extreme durations never make an
enqueue write and then raise, a Redis user granted only ``&asynq:cancel`` still gets
cancellation, and aggregated tasks go through the server's own Connection."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._worker.aggregator import GroupAggregatorRole
from asyncq.client import Client
from asyncq.inspector import Inspector
from asyncq.mux import ServeMux
from asyncq.proto.asynq import TaskMessage
from asyncq.server import Server
from asyncq.task import Task, TaskInfo, TaskState
from tests.acl import temporary_acl_user
from tests.test_broker import assert_ids_have_hashes
from tests.workers.support import FAST, stored_message, task_hash, wait_until

Q = "default"
MAX_I64 = 2**63 - 1
TIMEDELTA_MAX_SECONDS = 86_399_999_999_999  # whole seconds of timedelta.max
TIMEDELTA_MIN_SECONDS = -86_399_999_913_600  # timedelta.min, -999999999 days
UTC_MAX = datetime.max.replace(tzinfo=UTC)
UTC_MIN = datetime.min.replace(tzinfo=UTC)


def message(task_type: str = "x", **fields: Any) -> TaskMessage:
    base: dict[str, Any] = {"queue": Q, "retry": 3, "timeout": 60}
    return TaskMessage(id=str(uuid.uuid4()), type=task_type, **{**base, **fields})


async def seed_pending(redis: Redis, qname: str, msg: TaskMessage) -> bytes:
    """Write a task hash and its pending id directly (the way another writer could)."""
    raw = bytes(msg)
    await redis.hset(keys.task_key(qname, msg.id), mapping={"msg": raw, "state": "pending"})
    await redis.rpush(keys.pending_key(qname), msg.id)  # the next one dequeued
    return raw


# -- 1. a message whose queue field is not the queue it sits in --------------------------------


async def test_dequeue_archives_messages_of_another_or_blank_queue(
    broker: Broker, redis: Redis
) -> None:
    good = message()
    await broker.enqueue(good)
    blank = message(queue="")
    foreign = message(queue="other")
    blank_raw = await seed_pending(redis, Q, blank)
    foreign_raw = await seed_pending(redis, Q, foreign)

    got = await broker.dequeue_many([Q], 1)

    assert [d.message.id for d in got] == [good.id]
    archived = {m.decode() for m in await redis.zrange(keys.archived_key(Q), 0, -1)}
    assert archived == {blank.id, foreign.id}
    for msg, raw, shown in ((blank, blank_raw, "''"), (foreign, foreign_raw, "'other'")):
        h = await task_hash(redis, Q, msg.id)
        assert h[b"state"] == b"archived"
        assert h[b"msg"] == raw  # kept byte for byte
        assert (
            f"message queue {shown} does not match queue 'default'".encode() in h[b"asyncq_error"]
        )
    assert await redis.lrange(keys.active_key(Q), 0, -1) == [good.id.encode()]
    assert await redis.keys("asynq:{other}:*") == []
    await assert_ids_have_hashes(redis, Q)
    await assert_ids_have_hashes(redis, "other")


# -- 2. dequeue_many keeps what it took when a later call fails --------------------------------


class FaultyRedis:
    """The real client, except that EVALSHA fails with a connection error when its first
    key is in :attr:`fail_keys` (the command never reaches Redis)."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self.fail_keys: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)

    async def evalsha(self, sha: str, numkeys: int, *args: Any) -> Any:
        if numkeys and str(args[0]) in self.fail_keys:
            raise RedisConnectionError("injected: connection lost")
        return await self._redis.evalsha(sha, numkeys, *args)


@pytest.fixture
def faulty(redis: Redis) -> FaultyRedis:
    return FaultyRedis(redis)


@pytest.fixture
def flaky_broker(faulty: FaultyRedis) -> Broker:
    return Broker(cast(Any, faulty))


async def test_dequeue_many_returns_earlier_queues_tasks_when_a_later_call_fails(
    broker: Broker, flaky_broker: Broker, faulty: FaultyRedis, redis: Redis
) -> None:
    high = [message(queue="high") for _ in range(2)]
    low = [message(queue="low") for _ in range(2)]
    for msg in high + low:
        await broker.enqueue(msg)
    faulty.fail_keys.add(keys.pending_key("low"))

    with structlog.testing.capture_logs() as logs:
        got = await flaky_broker.dequeue_many(["high", "low"], 5)

    assert [d.message.id for d in got] == [m.id for m in high]
    assert any(
        e["log_level"] == "warning" and e.get("queue") == "low" and e.get("taken") == 2
        for e in logs
    ), logs
    # The failed queue is untouched; nothing taken so far: the error is the caller's.
    assert await redis.llen(keys.pending_key("low")) == 2
    with pytest.raises(RedisConnectionError):
        await flaky_broker.dequeue_many(["low", "high"], 5)
    faulty.fail_keys.clear()
    assert [d.message.id for d in await flaky_broker.dequeue_many(["low"], 5)] == [
        m.id for m in low
    ]


async def test_a_failed_archive_of_one_message_keeps_the_others_of_the_same_call(
    broker: Broker, flaky_broker: Broker, faulty: FaultyRedis, redis: Redis
) -> None:
    first, last = message(), message()
    await broker.enqueue(first)
    bad = message(queue="")
    await seed_pending(redis, Q, bad)
    await broker.enqueue(last)
    # The bad one is taken between the good ones; archiving it fails.
    faulty.fail_keys.add(keys.task_key(Q, bad.id))

    with structlog.testing.capture_logs() as logs:
        got = await flaky_broker.dequeue_many([Q], 3)

    assert [d.message.id for d in got] == [first.id, last.id]
    assert any(e["log_level"] == "warning" and e.get("task_id") == bad.id for e in logs), logs
    # Not lost: still active under its lease, so lease recovery meets it again (the
    # recoverer archives a message naming another queue, see test_runtime_audit).
    assert await redis.zscore(keys.lease_key(Q), bad.id) is not None
    faulty.fail_keys.clear()
    await redis.zadd(keys.lease_key(Q), {bad.id: 1})
    expired = await flaky_broker.list_lease_expired(datetime.now(UTC), [Q])
    assert [m.id for m in expired] == [bad.id]
    await assert_ids_have_hashes(redis, Q)


# -- 3. extreme durations and Go-written extreme values -----------------------------------------


async def test_timedelta_max_options_write_once_and_report_exactly(
    client: Client, redis: Redis
) -> None:
    top = timedelta(seconds=TIMEDELTA_MAX_SECONDS)
    info = await client.enqueue(Task("t", b"1"), timeout=timedelta.max)
    assert info.timeout == top
    assert (await stored_message(redis, Q, info.id)).timeout == TIMEDELTA_MAX_SECONDS

    info = await client.enqueue(Task("t", b"2"), retention=timedelta.max)
    assert info.retention == top
    assert (await stored_message(redis, Q, info.id)).retention == TIMEDELTA_MAX_SECONDS

    info = await client.enqueue(Task("t", b"3"), unique=timedelta.max)
    ttl = await redis.ttl(keys.unique_key(Q, "t", b"3"))
    assert TIMEDELTA_MAX_SECONDS - 60 < ttl <= TIMEDELTA_MAX_SECONDS

    results = await client.enqueue_many(
        [Task("t", b"4"), Task("t", b"5")], timeout=timedelta.max, retention=timedelta.max
    )
    assert all(isinstance(r, TaskInfo) and r.timeout == top for r in results), results
    assert await redis.llen(keys.pending_key(Q)) == 5  # each written exactly once


async def test_out_of_range_schedules_are_refused_before_any_write(
    client: Client, redis: Redis
) -> None:
    with pytest.raises(ValueError, match="process_in"):
        await client.enqueue(Task("t"), process_in=timedelta.max)
    with pytest.raises(ValueError, match="unique"):
        await client.enqueue(
            Task("t"), process_in=timedelta(days=1), unique=timedelta.max - timedelta(hours=1)
        )
    assert await redis.dbsize() == 0


def test_task_info_from_go_written_extremes_never_raises() -> None:
    msg = TaskMessage(
        id="x",
        queue=Q,
        type="t",
        timeout=MAX_I64,
        retention=MAX_I64,
        deadline=MAX_I64,
        last_failed_at=-(2**63),
        completed_at=253_402_300_800,  # 10000-01-01, one second past datetime.max
    )
    info = TaskInfo.from_message(msg, TaskState.COMPLETED, None)
    assert info.timeout == timedelta.max
    assert info.retention == timedelta.max
    assert info.deadline == UTC_MAX
    assert info.completed_at == UTC_MAX
    assert info.last_failed_at == UTC_MIN
    low = TaskInfo.from_message(
        TaskMessage(id="y", queue=Q, type="t", timeout=-(2**63), deadline=-62_135_596_800),
        TaskState.PENDING,
        None,
    )
    assert low.timeout == timedelta.min
    assert low.deadline == UTC_MIN  # Go's zero time, 0001-01-01


_I64 = st.integers(-(2**63), MAX_I64)


@given(_I64, _I64, _I64, _I64, _I64)
def test_task_info_accepts_any_int64(
    timeout: int, retention: int, deadline: int, failed_at: int, completed_at: int
) -> None:
    msg = TaskMessage(
        id="x",
        queue=Q,
        type="t",
        timeout=timeout,
        retention=retention,
        deadline=deadline,
        last_failed_at=failed_at,
        completed_at=completed_at,
    )
    info = TaskInfo.from_message(msg, TaskState.RETRY, None)
    for seconds, value in ((timeout, info.timeout), (retention, info.retention)):
        if seconds == 0:
            assert value is None
        elif TIMEDELTA_MIN_SECONDS <= seconds <= TIMEDELTA_MAX_SECONDS:
            assert value == timedelta(seconds=seconds)
        else:
            assert value == (timedelta.max if seconds > 0 else timedelta.min)
    for seconds, when in (
        (deadline, info.deadline),
        (failed_at, info.last_failed_at),
        (completed_at, info.completed_at),
    ):
        if seconds == 0:
            assert when is None
        else:
            assert when is not None and when.tzinfo is not None
            if UTC_MIN.timestamp() <= seconds <= UTC_MAX.timestamp():
                assert when == datetime.fromtimestamp(seconds, UTC)
            else:
                assert when == (UTC_MAX if seconds > 0 else UTC_MIN)


async def test_inspector_reads_a_go_written_task_with_extreme_values(
    redis: Redis, redis_url: str
) -> None:
    msg = message(timeout=MAX_I64, retention=MAX_I64, deadline=MAX_I64, completed_at=MAX_I64)
    await seed_pending(redis, Q, msg)
    await redis.sadd(keys.ALL_QUEUES, Q)
    async with Inspector(redis_url) as insp:
        info = await insp.get_task(Q, msg.id)
    assert info.timeout == timedelta.max
    assert info.deadline == UTC_MAX


# -- 4. a Redis user allowed only the cancel channel -------------------------------------------


@pytest.fixture
async def cancel_only_user(redis: Redis, redis_url: str) -> AsyncIterator[str]:
    """URL of an ACL user that may use every key and command but only the ``asynq:cancel``
    channel: everything Go asynq needs."""
    async with temporary_acl_user(
        redis, redis_url, "followup", "~*", "resetchannels", "&asynq:cancel", "+@all"
    ) as url:
        yield url


async def test_cancel_works_for_a_user_without_wakeup_channel_rights(
    redis: Redis, client: Client, cancel_only_user: str
) -> None:
    started = asyncio.Event()
    done: list[str] = []

    async def long(task: Task) -> None:
        started.set()
        await asyncio.sleep(3600)

    async def quick(task: Task) -> None:
        done.append(task.id or "")

    mux = ServeMux()
    mux.handle("long", long)
    mux.handle("quick", quick)
    server = Server(
        cancel_only_user,
        **{**FAST, "concurrency": 2, "task_check_interval": timedelta(milliseconds=50)},
        retry_delay=lambda n, e, t: timedelta(hours=1),
    )
    with structlog.testing.capture_logs() as logs:
        await server.start(mux)
        try:
            # Polling still finds work although no wake-up can arrive.
            info = await client.enqueue(Task("quick"))
            await wait_until(lambda: done == [info.id], what="quick task processed")
            long_info = await client.enqueue(Task("long"))
            await asyncio.wait_for(started.wait(), 10)
            async with Inspector(cancel_only_user) as insp:
                await insp.cancel(long_info.id)

            async def retried() -> bool:
                h = await task_hash(redis, Q, long_info.id)
                return h.get(b"state") == b"retry"

            await wait_until(retried, what="cancelled task moved to retry")
            assert (await stored_message(redis, Q, long_info.id)).error_msg == "context canceled"
            # Cancellation through a plain PUBLISH, by the admin, works the same way.
            started.clear()
            again = await client.enqueue(Task("long"))
            await asyncio.wait_for(started.wait(), 10)
            await redis.publish(keys.CANCEL_CHANNEL, again.id)

            async def again_retried() -> bool:
                return (await task_hash(redis, Q, again.id)).get(b"state") == b"retry"

            await wait_until(again_retried, what="second cancelled task moved to retry")
        finally:
            await server.shutdown()
    assert server.stats.role_restarts["subscriber"] == 0
    denied = [e for e in logs if "wake-up" in e["event"] and e["log_level"] == "warning"]
    assert len(denied) == 1, denied
    reconnects = [e for e in logs if "reconnecting" in e["event"]]
    assert reconnects == []


# -- 5. the aggregator enqueues through the server's Connection --------------------------------


async def test_aggregated_tasks_use_the_servers_connection(
    redis: Redis, redis_url: str, client: Client
) -> None:
    processed: list[bytes] = []

    async def aggregate(group: str, tasks: Sequence[Task]) -> Task:
        return Task("batch", b",".join(sorted(t.payload or b"" for t in tasks)))

    async def handle(task: Task) -> None:
        processed.append(task.payload or b"")

    mux = ServeMux()
    mux.handle("batch", handle)
    server = Server(
        redis_url,
        **FAST,
        group_aggregator=aggregate,
        group_check_interval=timedelta(milliseconds=100),
        group_grace_period=timedelta(minutes=1),
        group_max_size=2,
    )
    await server.start(mux)
    try:
        for payload in (b"a", b"b"):
            await client.enqueue(Task("item", payload), group="g")
        await wait_until(lambda: processed == [b"a,b"], what="aggregated task processed")
        assert any(isinstance(r, GroupAggregatorRole) for r in server._roles)
        enqueuer = server._enqueuer
        assert enqueuer is not None
        assert server.connection.fast is not None  # a URL-built server has the fast transport
        assert enqueuer.broker.fast is server.connection.fast
    finally:
        await server.shutdown()


def test_from_unix_clamps_every_int64() -> None:
    from datetime import UTC, datetime

    from asyncq._time import from_unix

    assert from_unix(0) is None
    assert from_unix(2**63 - 1) == datetime.max.replace(tzinfo=UTC)
    assert from_unix(-(2**63)) == datetime.min.replace(tzinfo=UTC)
    assert from_unix(1_700_000_000) == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
