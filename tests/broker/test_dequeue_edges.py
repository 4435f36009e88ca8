"""Dequeue edge cases: a message naming another (or no) queue is archived where it sits,
and a failing later call of dequeue_many loses nothing it already took."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, cast

import pytest
import structlog
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq.proto.asynq import TaskMessage
from tests.support import transitions
from tests.support.helpers import assert_ids_have_hashes
from tests.support.procs import task_hash

Q = "default"


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

    got = await transitions.dequeue_many(broker, [Q], 1)

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
        got = await transitions.dequeue_many(flaky_broker, ["high", "low"], 5)

    assert [d.message.id for d in got] == [m.id for m in high]
    assert any(
        e["log_level"] == "warning" and e.get("queue") == "low" and e.get("taken") == 2
        for e in logs
    ), logs
    # The failed queue is untouched; nothing taken so far: the error is the caller's.
    assert await redis.llen(keys.pending_key("low")) == 2
    with pytest.raises(RedisConnectionError):
        await transitions.dequeue_many(flaky_broker, ["low", "high"], 5)
    faulty.fail_keys.clear()
    assert [d.message.id for d in await transitions.dequeue_many(flaky_broker, ["low"], 5)] == [
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
        got = await transitions.dequeue_many(flaky_broker, [Q], 3)

    assert [d.message.id for d in got] == [first.id, last.id]
    assert any(e["log_level"] == "warning" and e.get("task_id") == bad.id for e in logs), logs
    # Not lost: still active under its lease, so lease recovery meets it again (the
    # recoverer archives a message naming another queue, see test_runtime_audit).
    assert await redis.zscore(keys.lease_key(Q), bad.id) is not None
    faulty.fail_keys.clear()
    await redis.zadd(keys.lease_key(Q), {bad.id: 1})
    expired = await transitions.list_lease_expired(flaky_broker, datetime.now(UTC), [Q])
    assert [m.id for m in expired] == [bad.id]
    await assert_ids_have_hashes(redis, Q)
