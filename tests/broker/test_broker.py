"""Broker client-side writes: Redis state before and after, normal and error paths.

Scores, ``pending_since`` and counter expiries are exact because the broker
runs on a fake clock (a whole second close to real time, so that EXPIREAT
values lie in the future for the real Redis).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from asyncq import _keys as keys
from asyncq._broker import BatchItem, Broker, PendingItem
from asyncq._redis.scripts import Script
from asyncq.errors import BrokerError, DuplicateTaskError, TaskIdConflictError
from tests.support import transitions
from tests.support.helpers import (
    NS,
    PENDING,
    SCHEDULED,
    T_PREFIX,
    FakeClock,
    Q,
    assert_ids_have_hashes,
    assert_relative_ttl,
    expiretime,
    make_msg,
    snapshot,
)

# -- enqueue ---------------------------------------------------------------------------


async def test_enqueue_writes_hash_pending_and_queue(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    msg = make_msg()
    await broker.enqueue(msg)
    assert await snapshot(redis) == {
        "asynq:queues": {b"default"},
        T_PREFIX + "t1": {
            b"msg": bytes(msg),
            b"state": b"pending",
            b"pending_since": str(int(clock.now) * NS).encode(),
        },
        PENDING: [b"t1"],
    }
    assert await expiretime(redis, T_PREFIX + "t1") == -1


async def test_enqueue_lpushes_new_work_at_the_head(broker: Broker, redis: Redis) -> None:
    for tid in ("a", "b", "c"):
        await broker.enqueue(make_msg(tid))
    assert await redis.lrange(PENDING, 0, -1) == [b"c", b"b", b"a"]


async def test_enqueue_id_conflict_changes_nothing(broker: Broker, redis: Redis) -> None:
    await broker.enqueue(make_msg(payload=b"first"))
    before = await snapshot(redis)
    with pytest.raises(TaskIdConflictError, match="t1"):
        await broker.enqueue(make_msg(payload=b"second"))
    assert await snapshot(redis) == before


async def test_enqueue_rejects_blank_id_and_queue(broker: Broker, redis: Redis) -> None:
    with pytest.raises(ValueError, match="no id"):
        await broker.enqueue(make_msg(""))
    with pytest.raises(ValueError, match="blank queue"):
        await broker.enqueue(make_msg(queue=" "))
    assert await redis.dbsize() == 0


async def test_queue_is_registered_with_every_write(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await broker.enqueue(make_msg("a"))
    await redis.srem(keys.ALL_QUEUES, Q)
    await broker.enqueue(make_msg("b"))
    # Unlike asynq's per-process cache, the same instance registers the queue again
    # (in the enqueue script itself), so a removed queue is listed once it has tasks.
    assert await redis.smembers(keys.ALL_QUEUES) == {b"default"}
    await redis.srem(keys.ALL_QUEUES, Q)
    with pytest.raises(TaskIdConflictError):
        await broker.enqueue(make_msg("b"))  # a refused write registers nothing
    assert await redis.smembers(keys.ALL_QUEUES) == set()


async def test_script_errors_become_broker_error(broker: Broker, redis: Redis) -> None:
    await redis.set(PENDING, "not a list")
    with pytest.raises(BrokerError, match="enqueue"):
        await broker.enqueue(make_msg())


def test_client_decoding_responses_is_rejected(redis_url: str) -> None:
    client = Redis.from_url(redis_url, decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses=False"):
        Broker(client)


# -- enqueue_unique --------------------------------------------------------------------


async def test_enqueue_unique_takes_lock_and_records_it(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    ukey = keys.unique_key(Q, "email:send", b"x")
    msg = make_msg(payload=b"x", unique_key=ukey)
    await broker.write(BatchItem(msg, unique_ttl=300))
    assert await snapshot(redis) == {
        "asynq:queues": {b"default"},
        ukey: b"t1",
        T_PREFIX + "t1": {
            b"msg": bytes(msg),
            b"state": b"pending",
            b"pending_since": str(int(clock.now) * NS).encode(),
            b"unique_key": ukey.encode(),
        },
        PENDING: [b"t1"],
    }
    await assert_relative_ttl(redis, ukey, clock, 300)


async def test_enqueue_unique_duplicate_changes_nothing(broker: Broker, redis: Redis) -> None:
    ukey = keys.unique_key(Q, "email:send", b"x")
    await broker.write(BatchItem(make_msg("a", payload=b"x", unique_key=ukey), unique_ttl=300))
    before = await snapshot(redis)
    with pytest.raises(DuplicateTaskError, match="unique"):
        await broker.write(BatchItem(make_msg("b", payload=b"x", unique_key=ukey), unique_ttl=300))
    assert await snapshot(redis) == before


async def test_enqueue_unique_id_conflict_keeps_the_new_lock(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await broker.enqueue(make_msg("a"))
    ukey = keys.unique_key(Q, "email:send", b"other")
    before = await snapshot(redis)
    with pytest.raises(TaskIdConflictError):
        await broker.write(
            BatchItem(make_msg("a", payload=b"other", unique_key=ukey), unique_ttl=60)
        )
    # asynq leaves the lock it just took in place (spec section 11.8).
    assert await snapshot(redis) == {**before, ukey: b"a"}
    await assert_relative_ttl(redis, ukey, clock, 60)


async def test_unique_writes_validate_lock_and_ttl(broker: Broker, redis: Redis) -> None:
    with pytest.raises(ValueError, match="unique_key"):
        await broker.write(BatchItem(make_msg(), unique_ttl=10))
    ukey = keys.unique_key(Q, "email:send", None)
    with pytest.raises(ValueError, match="at least 1 second"):
        await broker.write(BatchItem(make_msg(unique_key=ukey), unique_ttl=0))
    foreign = keys.unique_key("other", "email:send", None)
    with pytest.raises(ValueError, match="does not belong to queue"):
        await broker.write(BatchItem(make_msg(unique_key=foreign), unique_ttl=10))
    assert await redis.dbsize() == 0


# -- schedule --------------------------------------------------------------------------


async def test_schedule_writes_hash_and_score(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    msg = make_msg(group_key="g")
    at = clock.dt + timedelta(minutes=5, microseconds=900_000)
    await broker.schedule(msg, at)
    assert await snapshot(redis) == {
        "asynq:queues": {b"default"},
        # No group field even though the message has a group (scheduling wins).
        T_PREFIX + "t1": {b"msg": bytes(msg), b"state": b"scheduled"},
        SCHEDULED: [(b"t1", clock.now + 300)],
    }


async def test_schedule_id_conflict_and_naive_time(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await broker.schedule(make_msg(), clock.dt)
    before = await snapshot(redis)
    with pytest.raises(TaskIdConflictError):
        await broker.schedule(make_msg(), clock.dt + timedelta(hours=1))
    with pytest.raises(ValueError, match="timezone-aware"):
        await broker.schedule(make_msg("n"), datetime(2030, 1, 1))
    assert await snapshot(redis) == before


async def test_schedule_unique(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    ukey = keys.unique_key(Q, "email:send", b"")
    assert ukey.endswith(":d41d8cd98f00b204e9800998ecf8427e")
    msg = make_msg(payload=b"", unique_key=ukey)
    at = clock.dt + timedelta(seconds=90)
    await broker.write(BatchItem(msg, process_at=at, unique_ttl=150))
    assert await snapshot(redis) == {
        "asynq:queues": {b"default"},
        ukey: b"t1",
        T_PREFIX + "t1": {
            b"msg": bytes(msg),
            b"state": b"scheduled",
            b"unique_key": ukey.encode(),
        },
        SCHEDULED: [(b"t1", clock.now + 90)],
    }
    await assert_relative_ttl(redis, ukey, clock, 150)
    before = await snapshot(redis)
    with pytest.raises(DuplicateTaskError):
        await broker.write(
            BatchItem(make_msg("t2", payload=b"", unique_key=ukey), process_at=at, unique_ttl=150)
        )
    assert await snapshot(redis) == before
    other = keys.unique_key(Q, "email:send", b"z")
    with pytest.raises(TaskIdConflictError):
        await broker.write(
            BatchItem(make_msg("t1", payload=b"z", unique_key=other), process_at=at, unique_ttl=150)
        )
    assert await snapshot(redis) == {**before, other: b"t1"}


# -- groups ----------------------------------------------------------------------------


async def test_add_to_group(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    msg = make_msg(group_key="batch")
    await broker.write(BatchItem(msg, group="batch"))
    assert await snapshot(redis) == {
        "asynq:queues": {b"default"},
        T_PREFIX + "t1": {b"msg": bytes(msg), b"state": b"aggregating", b"group": b"batch"},
        "asynq:{default}:g:batch": [(b"t1", clock.now)],
        "asynq:{default}:groups": {b"batch"},
    }
    before = await snapshot(redis)
    with pytest.raises(TaskIdConflictError):
        await broker.write(BatchItem(make_msg(group_key="batch"), group="batch"))
    with pytest.raises(ValueError, match="group name"):
        await broker.write(BatchItem(make_msg("x"), group=""))
    assert await snapshot(redis) == before


async def test_add_to_group_unique(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    ukey = keys.unique_key(Q, "email:send", b"u")
    msg = make_msg(payload=b"u", unique_key=ukey, group_key="g1")
    await broker.write(BatchItem(msg, group="g1", unique_ttl=30))
    assert await snapshot(redis) == {
        "asynq:queues": {b"default"},
        ukey: b"t1",
        # asynq writes no unique_key field on this path.
        T_PREFIX + "t1": {b"msg": bytes(msg), b"state": b"aggregating", b"group": b"g1"},
        "asynq:{default}:g:g1": [(b"t1", clock.now)],
        "asynq:{default}:groups": {b"g1"},
    }
    await assert_relative_ttl(redis, ukey, clock, 30)
    before = await snapshot(redis)
    with pytest.raises(DuplicateTaskError):
        await broker.write(
            BatchItem(make_msg("t2", payload=b"u", unique_key=ukey), group="g1", unique_ttl=30)
        )
    assert await snapshot(redis) == before
    other = keys.unique_key(Q, "email:send", b"v")
    with pytest.raises(TaskIdConflictError):
        await broker.write(
            BatchItem(make_msg(payload=b"v", unique_key=other), group="g1", unique_ttl=30)
        )
    assert await snapshot(redis) == {**before, other: b"t1"}


# -- batch -----------------------------------------------------------------------------


async def test_enqueue_batch_results_and_state(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await broker.enqueue(make_msg("exists", queue="other"))
    ukey = keys.unique_key(Q, "email:send", b"u")
    await redis.set(ukey, "holder")
    at = clock.dt + timedelta(seconds=10)
    items = [
        BatchItem(make_msg("p1")),
        BatchItem(make_msg("s1"), process_at=at),
        BatchItem(make_msg("s2"), process_at=clock.now + 20),
        BatchItem(make_msg("exists", queue="other")),
        BatchItem(make_msg("")),
        BatchItem(make_msg("dup", payload=b"u", unique_key=ukey), unique_ttl=60),
        BatchItem(make_msg("g1", group_key="grp"), group="grp"),
        BatchItem(make_msg("p2", queue="third")),
        BatchItem(make_msg("p1")),
    ]
    results = await broker.enqueue_batch(items)
    assert results[0] is None
    assert results[1] is None
    assert results[2] is None
    assert isinstance(results[3], TaskIdConflictError)
    assert isinstance(results[4], ValueError)
    assert isinstance(results[5], DuplicateTaskError)
    assert results[6] is None
    assert results[7] is None
    assert isinstance(results[8], TaskIdConflictError)
    assert await redis.smembers(keys.ALL_QUEUES) == {b"default", b"other", b"third"}
    assert await redis.lrange(PENDING, 0, -1) == [b"p1"]
    assert await redis.hgetall(T_PREFIX + "p1") == {
        b"msg": bytes(make_msg("p1")),
        b"state": b"pending",
        b"pending_since": str(int(clock.now) * NS).encode(),
    }
    assert await redis.zrange(SCHEDULED, 0, -1, withscores=True) == [
        (b"s1", clock.now + 10),
        (b"s2", clock.now + 20),
    ]
    assert await redis.zrange("asynq:{default}:g:grp", 0, -1) == [b"g1"]
    assert await redis.lrange("asynq:{third}:pending", 0, -1) == [b"p2"]
    assert not await redis.exists(T_PREFIX + "dup")
    await assert_ids_have_hashes(redis)


async def test_enqueue_batch_that_writes_nothing_registers_no_queue(
    broker: Broker, redis: Redis
) -> None:
    # Go asynq's RemoveQueue unregisters a queue but leaves its completed tasks' hashes:
    # a batch whose every id is one of them writes nothing, so it does not list the
    # queue again either.
    await broker.enqueue(make_msg("left", retention=3600))
    task = await transitions.dequeue(broker, [Q])
    assert task is not None
    await broker.mark_as_complete(task.message)
    await redis.srem(keys.ALL_QUEUES, Q)
    await redis.delete(keys.completed_key(Q))
    before = await snapshot(redis)

    results = await broker.enqueue_batch([PendingItem(Q, "left", bytes(make_msg("left")))])

    assert isinstance(results[0], TaskIdConflictError)
    assert await snapshot(redis) == before


async def test_enqueue_batch_unique_variants_and_script_flush(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    u1, u2, u3 = (keys.unique_key(Q, "email:send", p) for p in (b"1", b"2", b"3"))
    items = [
        BatchItem(make_msg("a", payload=b"1", unique_key=u1), unique_ttl=10),
        BatchItem(make_msg("b", payload=b"2", unique_key=u2), process_at=clock.now, unique_ttl=20),
        BatchItem(make_msg("c", payload=b"3", unique_key=u3), group="g", unique_ttl=30),
    ]
    await redis.script_flush()
    assert await broker.enqueue_batch(items) == [None, None, None]
    assert [await redis.get(k) for k in (u1, u2, u3)] == [b"a", b"b", b"c"]
    for key, ttl in ((u1, 10), (u2, 20), (u3, 30)):
        await assert_relative_ttl(redis, key, clock, ttl)
    assert await redis.hget(T_PREFIX + "a", "unique_key") == u1.encode()
    assert await redis.hget(T_PREFIX + "b", "state") == b"scheduled"
    assert await redis.hget(T_PREFIX + "c", "state") == b"aggregating"
    assert await broker.enqueue_batch([]) == []


async def test_enqueue_batch_falls_back_when_scripts_vanish(
    broker: Broker, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Scripts flushed between SCRIPT LOAD and the pipeline: every EVALSHA answers
    # NOSCRIPT and each item is run again on its own (which reloads the script).
    real_load = Script.load
    calls: list[str] = []

    async def load_then_flush(self: Script, client: Any) -> None:
        await real_load(self, client)
        if not calls:
            await client.script_flush()
        calls.append(self.name)

    monkeypatch.setattr(Script, "load", load_then_flush)
    results = await broker.enqueue_batch([BatchItem(make_msg(f"n{i}")) for i in range(3)])
    assert results == [None, None, None]
    assert await redis.lrange(PENDING, 0, -1) == [b"n2", b"n1", b"n0"]
    assert calls == ["enqueue", "enqueue"]  # the batch's load, then one reload


# -- wake-up channel -------------------------------------------------------------------


@pytest.fixture
async def wakeups(redis_url: str) -> AsyncIterator[PubSub]:
    client = Redis.from_url(redis_url)
    pubsub = client.pubsub()
    await pubsub.subscribe(keys.wakeup_channel(Q))
    msg = await pubsub.get_message(timeout=5)
    assert msg is not None
    assert msg["type"] == "subscribe"
    try:
        yield pubsub
    finally:
        await pubsub.aclose()
        await client.aclose()


async def next_wakeup(pubsub: PubSub) -> bytes | None:
    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
    return None if msg is None else msg["data"]


async def test_wakeup_published_only_when_pending_was_empty(
    broker: Broker, wakeups: PubSub
) -> None:
    await broker.enqueue(make_msg("a"))
    assert await next_wakeup(wakeups) == b"default"
    await broker.enqueue(make_msg("b"))
    ukey = keys.unique_key(Q, "t", b"")
    await broker.write(BatchItem(make_msg("c", unique_key=ukey), unique_ttl=10))
    # A marker on the same connection proves nothing else was published before it.
    await broker.redis.publish(keys.wakeup_channel(Q), "marker")
    assert await next_wakeup(wakeups) == b"marker"


async def test_wakeup_from_unique_requeue_and_forward(
    broker: Broker, redis: Redis, clock: FakeClock, wakeups: PubSub
) -> None:
    ukey = keys.unique_key(Q, "t", b"")
    await broker.write(BatchItem(make_msg("a", unique_key=ukey), unique_ttl=10))
    assert await next_wakeup(wakeups) == b"default"
    task = await transitions.dequeue(broker, [Q])
    assert task is not None
    await broker.requeue(task.message)
    assert await next_wakeup(wakeups) == b"default"
    await redis.delete(PENDING)
    await broker.schedule(make_msg("s1"), clock.dt)
    await broker.schedule(make_msg("s2"), clock.dt)
    assert await transitions.forward_if_ready(broker, [Q]) == 2
    assert await next_wakeup(wakeups) == b"default"
    await broker.redis.publish(keys.wakeup_channel(Q), "marker")
    assert await next_wakeup(wakeups) == b"marker"


async def test_wakeup_from_the_forwarder_only_when_pending_was_empty(
    broker: Broker, redis: Redis, clock: FakeClock, wakeups: PubSub
) -> None:
    # A due task onto an empty pending list: a wake-up.
    await broker.schedule(make_msg("s1"), clock.dt)
    assert await broker.forward_queues([Q]) == 1
    assert await next_wakeup(wakeups) == b"default"
    await broker.redis.publish(keys.wakeup_channel(Q), "marker")
    assert await next_wakeup(wakeups) == b"marker"
    # Onto a list that already holds work, or nothing due: none.
    await broker.schedule(make_msg("s2"), clock.dt)
    await broker.schedule(make_msg("s3"), clock.dt)
    assert await broker.forward_queues([Q]) == 2
    assert await broker.forward_queues([Q]) == 0
    await broker.redis.publish(keys.wakeup_channel(Q), "marker")
    assert await next_wakeup(wakeups) == b"marker"
    assert await redis.lrange(PENDING, 0, -1) == [b"s3", b"s2", b"s1"]


async def test_no_wakeup_for_scheduled_or_grouped_writes(
    broker: Broker, clock: FakeClock, wakeups: PubSub
) -> None:
    await broker.schedule(make_msg("s"), clock.dt + timedelta(hours=1))
    await broker.write(BatchItem(make_msg("g"), group="grp"))
    await broker.redis.publish(keys.wakeup_channel(Q), "marker")
    assert await next_wakeup(wakeups) == b"marker"


async def test_wakeup_from_batch(broker: Broker, wakeups: PubSub) -> None:
    await broker.enqueue_batch([BatchItem(make_msg(f"b{i}")) for i in range(5)])
    assert await next_wakeup(wakeups) == b"default"
    await broker.redis.publish(keys.wakeup_channel(Q), "marker")
    assert await next_wakeup(wakeups) == b"marker"


async def test_concurrent_enqueues_keep_every_task(broker: Broker, redis: Redis) -> None:
    await asyncio.gather(*(broker.enqueue(make_msg(f"c{i}")) for i in range(50)))
    assert await redis.llen(PENDING) == 50
    await assert_ids_have_hashes(redis)


# -- without the registry key (as on a cluster) -----------------------------------------


@pytest.mark.parametrize(
    "how",
    ["enqueue", "enqueue_unique", "schedule", "schedule_unique", "group", "group_unique", "many"],
)
async def test_each_write_without_the_registry_key_writes_the_task_only(
    broker: Broker, redis: Redis, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # On a cluster the scripts get no asynq:queues key (it is in another slot; the queue
    # is registered by a command of its own): each must then write the task alone.
    monkeypatch.setattr(broker, "_registry", lambda: ())
    ukey = keys.unique_key(Q, "email:send", b"u")
    msg = make_msg(unique_key=ukey) if how.endswith("unique") else make_msg()
    at = clock.dt + timedelta(minutes=5)
    if how == "enqueue":
        await broker.enqueue(msg)
    elif how == "enqueue_unique":
        await broker.write(BatchItem(msg, unique_ttl=60))
    elif how == "schedule":
        await broker.schedule(msg, at)
    elif how == "schedule_unique":
        await broker.write(BatchItem(msg, process_at=at, unique_ttl=60))
    elif how == "group":
        await broker.write(BatchItem(msg, group="g"))
    elif how == "group_unique":
        await broker.write(BatchItem(msg, group="g", unique_ttl=60))
    else:
        assert await broker.enqueue_batch([PendingItem(Q, "t1", bytes(msg))]) == [None]
    state = {"enqueue": b"pending", "schedule": b"scheduled", "group": b"aggregating"}
    snap = await snapshot(redis)
    assert snap[T_PREFIX + "t1"][b"state"] == state.get(how.split("_", maxsplit=1)[0], b"pending")
    if how == "many":  # the batch registers its new queues with a SADD of its own
        assert snap[keys.ALL_QUEUES] == {b"default"}
    else:
        assert keys.ALL_QUEUES not in snap
    assert (ukey in snap) == how.endswith("unique")


@pytest.mark.parametrize("task_id", ["0a1b2c3d-0a1b-4c3d-8a1b-0a1b2c3d4e5f", "ünï-%d-x"])
async def test_write_pending_sends_exactly_the_script_call_it_describes(
    redis: Redis, redis_url: str, task_id: str
) -> None:
    """The hot path's command, packed once per queue, is byte for byte the EVALSHA of
    enqueue.lua's KEYS and ARGV (what the general path and redis-py would send)."""
    from asyncq._redis.connection import Connection
    from asyncq._redis.transport import _pack_command
    from tests.support.helpers import counted_writes

    conn = Connection(redis_url)
    try:
        assert conn.fast is not None
        broker = Broker(conn.redis, fast=conn.fast, clock=lambda: 1_800_000_000.123456)
        await broker.write_pending("q%", "warm", b"x")  # connects and loads the script
        with counted_writes(conn.fast) as writes:
            await broker.write_pending("q%", task_id, b"\x00%b%d")
        qk = broker._q("q%")
        whole = ("EVALSHA", *broker._enqueue_command(qk, task_id, b"\x00%b%d", broker.clock()))
        assert writes == [_pack_command(whole)]
        stored = await redis.hgetall(keys.task_key("q%", task_id))
        assert stored[b"msg"] == b"\x00%b%d" and stored[b"state"] == b"pending"
        assert stored[b"pending_since"] == b"1800000000123456000"
    finally:
        await conn.aclose()
