"""Broker heartbeat records, scheduler records, cancellation and aggregation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._broker import BatchItem, Broker
from asyncq._time import GO_ZERO_TIME
from asyncq.errors import BrokerError
from asyncq.proto.asynq import (
    SchedulerEnqueueEvent,
    SchedulerEntry,
    ServerInfo,
    TaskMessage,
    WorkerInfo,
)
from tests.support import transitions
from tests.support.helpers import (
    T_PREFIX,
    FakeClock,
    assert_ids_have_hashes,
    assert_relative_ttl,
    make_msg,
    snapshot,
)

Q = "default"
GROUPS = "asynq:{default}:groups"
AGG_SETS = "asynq:{default}:aggregation_sets"


# -- server state ----------------------------------------------------------------------


def server_info(clock: FakeClock) -> ServerInfo:
    return ServerInfo(
        host="host1",
        pid=4242,
        server_id="sid",
        concurrency=10,
        queues={"default": 1, "critical": 6},
        status="active",
        start_time=clock.dt,
        active_worker_count=2,
    )


async def test_write_and_clear_server_state(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    info = server_info(clock)
    workers = [
        WorkerInfo(host="host1", pid=4242, server_id="sid", task_id=f"w{i}", queue=Q)
        for i in range(2)
    ]
    await broker.write_server_state(info, workers, 10)
    skey = "asynq:servers:{host1:4242:sid}"
    wkey = "asynq:workers:{host1:4242:sid}"
    assert await snapshot(redis) == {
        "asynq:servers": [(skey.encode(), clock.now + 10)],
        "asynq:workers": [(wkey.encode(), clock.now + 10)],
        skey: bytes(info),
        wkey: {b"w0": bytes(workers[0]), b"w1": bytes(workers[1])},
    }
    assert ServerInfo.parse(await redis.get(skey)) == info
    for key in (skey, wkey):
        await assert_relative_ttl(redis, key, clock, 10)
    # A later beat with no workers drops the old worker records.
    await broker.write_server_state(info, [], 10)
    assert not await redis.exists(wkey)
    await broker.clear_server_state("host1", 4242, "sid")
    assert await snapshot(redis) == {}
    with pytest.raises(ValueError, match="ttl"):
        await broker.write_server_state(info, [], 0.5)


# -- scheduler records -----------------------------------------------------------------


async def test_write_and_clear_scheduler_entries(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    entries = [
        SchedulerEntry(
            id=f"e{i}",
            spec="@every 30s",
            task_type="report",
            enqueue_options=['Queue("default")'],
            next_enqueue_time=clock.dt,
            prev_enqueue_time=GO_ZERO_TIME,
        )
        for i in range(3)
    ]
    await broker.write_scheduler_entries("host:1:sched", entries, 20)
    key = "asynq:schedulers:{host:1:sched}"
    snap = await snapshot(redis)
    assert snap["asynq:schedulers"] == [(key.encode(), clock.now + 20)]
    # LPUSHed one by one, so stored newest-first.
    assert snap[key] == [bytes(e) for e in reversed(entries)]
    await assert_relative_ttl(redis, key, clock, 20)
    await broker.write_scheduler_entries("host:1:sched", entries[:1], 20)
    assert await redis.lrange(key, 0, -1) == [bytes(entries[0])]
    await broker.clear_scheduler_entries("host:1:sched")
    assert await snapshot(redis) == {}


async def test_scheduler_history_keeps_newest_1000(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    key = keys.scheduler_history_key("entry")
    base = int(clock.now) - 5000
    await redis.zadd(key, {f"old{i}": base + i for i in range(1000)})
    event = SchedulerEnqueueEvent(task_id="new", enqueue_time=clock.dt)
    await broker.record_scheduler_enqueue_event("entry", event)
    members = await redis.zrange(key, 0, -1, withscores=True)
    assert len(members) == 1000
    assert members[0] == (b"old1", base + 1)
    assert members[-1] == (bytes(event), clock.now)
    with pytest.raises(ValueError, match="no time"):
        await broker.record_scheduler_enqueue_event("entry", SchedulerEnqueueEvent("x"))
    await broker.clear_scheduler_history("entry")
    assert not await redis.exists(key)


async def test_publish_cancelation(broker: Broker, redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(keys.CANCEL_CHANNEL)
        assert (await pubsub.get_message(timeout=5))["type"] == "subscribe"
        await broker.publish_cancelation("task-9")
        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
        assert msg is not None
        assert (msg["channel"], msg["data"]) == (b"asynq:cancel", b"task-9")
    finally:
        await pubsub.aclose()
        await client.aclose()


# -- aggregation -----------------------------------------------------------------------


async def grouped(broker: Broker, clock: FakeClock, group: str, n: int, step: float = 1) -> None:
    """Add *n* tasks to *group*, one every *step* seconds (the clock ends at the last add)."""
    for i in range(n):
        await broker.write(BatchItem(make_msg(f"{group}-{i}", group_key=group), group=group))
        clock.now += step
    clock.now -= step


async def test_list_groups(broker: Broker, clock: FakeClock) -> None:
    assert await broker.list_groups(Q) == []
    await grouped(broker, clock, "b", 1)
    await grouped(broker, clock, "a", 1)
    assert await broker.list_groups(Q) == ["a", "b"]


async def test_aggregation_check_not_ready(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    assert await broker.aggregation_check(Q, "g", clock.dt, 60, 0, 0) is None
    await grouped(broker, clock, "g", 3)
    before = await snapshot(redis)
    assert await broker.aggregation_check(Q, "g", clock.dt, 60, 600, 10) is None
    assert await snapshot(redis) == before


async def test_aggregation_check_max_size(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    await grouped(broker, clock, "g", 5)
    start = clock.now - 4
    set_id = await broker.aggregation_check(Q, "g", clock.dt, 60, 0, 3)
    assert set_id is not None
    set_key = f"asynq:{{default}}:g:g:{set_id}"
    snap = await snapshot(redis)
    assert snap[set_key] == [(f"g-{i}".encode(), start + i) for i in range(3)]
    assert snap["asynq:{default}:g:g"] == [(b"g-3", start + 3), (b"g-4", start + 4)]
    assert snap[AGG_SETS] == [(set_key.encode(), clock.now + 120)]
    assert snap[GROUPS] == {b"g"}  # two tasks are left
    # Exactly max_size left: staged and the group name removed.
    second = await broker.aggregation_check(Q, "g", clock.dt, 60, 0, 2)
    assert second is not None
    assert not await redis.exists("asynq:{default}:g:g")
    assert not await redis.exists(GROUPS)


async def test_aggregation_check_max_delay(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    await grouped(broker, clock, "g", 4, step=10)  # scores T .. T+30
    # Oldest is 30 s old: max_delay 31 not reached, 30 reached.
    assert await broker.aggregation_check(Q, "g", clock.dt, 600, 31, 0) is None
    set_id = await broker.aggregation_check(Q, "g", clock.dt, 600, 30, 0)
    assert set_id is not None
    assert await redis.zcard(f"asynq:{{default}}:g:g:{set_id}") == 4
    assert not await redis.exists(GROUPS)


async def test_aggregation_check_max_delay_with_max_size(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await grouped(broker, clock, "g", 4, step=10)
    set_id = await broker.aggregation_check(Q, "g", clock.dt, 600, timedelta(seconds=5), 5)
    assert set_id is not None
    assert await redis.zcard(f"asynq:{{default}}:g:g:{set_id}") == 4
    assert not await redis.exists(GROUPS)  # size 4 <= max_size 5


async def test_aggregation_check_grace_period(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await grouped(broker, clock, "g", 2)
    t = clock.dt + timedelta(seconds=59)
    assert await broker.aggregation_check(Q, "g", t, 60, 0, 0) is None
    set_id = await broker.aggregation_check(Q, "g", t + timedelta(seconds=1), 60, 0, 0)
    assert set_id is not None
    assert await redis.zcard(f"asynq:{{default}}:g:g:{set_id}") == 2
    with pytest.raises(ValueError, match="negative"):
        await broker.aggregation_check(Q, "g", t, -1, 0, 0)


async def test_read_and_delete_aggregation_set(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await grouped(broker, clock, "g", 3)
    await grouped(broker, clock, "other", 1)
    set_id = await broker.aggregation_check(Q, "g", clock.dt, 0, 0, 3)
    assert set_id is not None
    msgs, deadline = await broker.read_aggregation_set(Q, "g", set_id)
    assert [m.id for m in msgs] == ["g-0", "g-1", "g-2"]
    assert msgs[0] == make_msg("g-0", group_key="g")
    assert deadline == datetime.fromtimestamp(int(clock.now) + 120, UTC)
    await broker.delete_aggregation_set(Q, "g", set_id)
    snap = await snapshot(redis)
    assert not any(k.startswith(T_PREFIX + "g-") for k in snap)
    assert f"asynq:{{default}}:g:g:{set_id}" not in snap
    assert AGG_SETS not in snap
    assert T_PREFIX + "other-0" in snap
    with pytest.raises(BrokerError, match="not staged"):
        await broker.read_aggregation_set(Q, "g", set_id)


async def test_read_aggregation_set_archives_undecodable_member(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await grouped(broker, clock, "g", 2)
    await redis.hset(T_PREFIX + "g-0", "msg", b"garbage bytes here")
    set_id = await broker.aggregation_check(Q, "g", clock.dt, 0, 0, 2)
    assert set_id is not None
    msgs, _ = await broker.read_aggregation_set(Q, "g", set_id)
    assert [m.id for m in msgs] == ["g-1"]
    assert await redis.zrange("asynq:{default}:archived", 0, -1) == [b"g-0"]
    assert await redis.hget(T_PREFIX + "g-0", "msg") == b"garbage bytes here"
    assert await redis.zrange(f"asynq:{{default}}:g:g:{set_id}", 0, -1) == [b"g-1"]
    await broker.delete_aggregation_set(Q, "g", set_id)
    assert await redis.hget(T_PREFIX + "g-0", "state") == b"archived"
    await assert_ids_have_hashes(redis)


async def test_reclaim_stale_aggregation_sets(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await grouped(broker, clock, "a:b", 2)  # a colon in the group name
    await grouped(broker, clock, "fresh", 1)
    stale = await broker.aggregation_check(Q, "a:b", clock.dt, 0, 0, 0)
    clock.now += 60
    fresh = await broker.aggregation_check(Q, "fresh", clock.dt, 0, 0, 0)
    assert stale is not None
    assert fresh is not None
    assert not await redis.exists(GROUPS)
    before = await snapshot(redis)
    clock.now += 60  # the first set's deadline
    await transitions.reclaim_stale_aggregation_sets(broker, Q)
    snap = await snapshot(redis)
    assert snap["asynq:{default}:g:a:b"] == before[f"asynq:{{default}}:g:a:b:{stale}"]
    assert f"asynq:{{default}}:g:a:b:{stale}" not in snap
    assert snap[AGG_SETS] == [(f"asynq:{{default}}:g:fresh:{fresh}".encode(), clock.now + 60)]
    # asyncq re-registers the group so the aggregator sees it again.
    assert snap[GROUPS] == {b"a:b"}
    again = await broker.aggregation_check(Q, "a:b", clock.dt, 0, 0, 0)
    msgs, _ = await broker.read_aggregation_set(Q, "a:b", again or "")
    assert [m.id for m in msgs] == ["a:b-0", "a:b-1"]


async def test_aggregated_messages_decode_like_enqueued(broker: Broker, clock: FakeClock) -> None:
    msg = TaskMessage(type="t", payload=b"\x00", id="x", queue=Q, group_key="g", headers={"k": "v"})
    await broker.write(BatchItem(msg, group="g"))
    set_id = await broker.aggregation_check(Q, "g", clock.dt, 0, 0, 1)
    assert set_id is not None
    msgs, _ = await broker.read_aggregation_set(Q, "g", set_id)
    assert msgs == [msg]
