"""Broker server-side processing: dequeue, done, complete, requeue, retry, archive, forward,
leases, janitor, undecodable messages and the enqueue -> dequeue round trip."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._broker import LEASE_DURATION, BatchItem, Broker
from asyncq.errors import TaskNotFoundError
from asyncq.proto.asynq import TaskMessage
from tests.support import transitions
from tests.support.helpers import (
    NS,
    PENDING,
    SCHEDULED,
    T_PREFIX,
    FakeClock,
    assert_ids_have_hashes,
    expiretime,
    make_msg,
    snapshot,
)

Q = "default"
ACTIVE = "asynq:{default}:active"
LEASE = "asynq:{default}:lease"
RETRY = "asynq:{default}:retry"
ARCHIVED = "asynq:{default}:archived"
COMPLETED = "asynq:{default}:completed"
PROCESSED = "asynq:{default}:processed"
FAILED = "asynq:{default}:failed"
MAXI64 = 9223372036854775807
DAY90 = 90 * 24 * 3600


def daily(clock: FakeClock) -> tuple[str, str]:
    return keys.processed_key(Q, clock.dt), keys.failed_key(Q, clock.dt)


async def active_task(broker: Broker, msg: TaskMessage) -> TaskMessage:
    """Enqueue *msg* and dequeue it, so it is active with a lease."""
    await broker.enqueue(msg)
    got = await transitions.dequeue(broker, [msg.queue])
    assert got is not None
    assert got.message == msg
    return got.message


# -- dequeue ---------------------------------------------------------------------------


async def test_dequeue_moves_oldest_to_active_with_lease(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    first, second = make_msg("a"), make_msg("b")
    await broker.enqueue(first)
    await broker.enqueue(second)
    clock.now += 7
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    assert got.message == first
    assert got.lease_expiry == clock.now + LEASE_DURATION
    snap = await snapshot(redis)
    assert snap[PENDING] == [b"b"]
    assert snap[ACTIVE] == [b"a"]
    assert snap[LEASE] == [(b"a", clock.now + 30)]
    # state=active, pending_since gone, msg untouched.
    assert snap[T_PREFIX + "a"] == {b"msg": bytes(first), b"state": b"active"}


async def test_dequeue_empty_and_unknown_queues(broker: Broker, redis: Redis) -> None:
    assert await transitions.dequeue(broker, [Q, "nothing"]) is None
    assert await transitions.dequeue(broker, []) is None
    assert await redis.dbsize() == 0


async def test_dequeue_skips_paused_queue(broker: Broker, redis: Redis) -> None:
    await broker.enqueue(make_msg("p", queue="paused"))
    await broker.enqueue(make_msg("o", queue="open"))
    await redis.set(keys.paused_key("paused"), "1700000000")
    before = await redis.hgetall(keys.task_key("paused", "p"))
    got = await transitions.dequeue(broker, ["paused", "open"])
    assert got is not None
    assert got.message.id == "o"
    assert await redis.lrange(keys.pending_key("paused"), 0, -1) == [b"p"]
    assert await redis.hgetall(keys.task_key("paused", "p")) == before
    assert await transitions.dequeue(broker, ["paused"]) is None


async def test_dequeue_many_fills_across_queues_in_order(broker: Broker, redis: Redis) -> None:
    for i in range(3):
        await broker.enqueue(make_msg(f"h{i}", queue="high"))
    for i in range(4):
        await broker.enqueue(make_msg(f"l{i}", queue="low"))
    got = await transitions.dequeue_many(broker, ["high", "low"], 5)
    assert [t.message.id for t in got] == ["h0", "h1", "h2", "l0", "l1"]
    assert await redis.llen(keys.pending_key("low")) == 2
    assert await redis.zcard(keys.lease_key("low")) == 2
    rest = await transitions.dequeue_many(broker, ["high", "low"], 10)
    assert [t.message.id for t in rest] == ["l2", "l3"]
    with pytest.raises(ValueError, match="at least 1"):
        await transitions.dequeue_many(broker, [Q], 0)


async def test_dequeue_archives_malformed_message_and_returns_next(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    good = make_msg("good")
    await broker.enqueue(good)
    # Two broken tasks taken before the good one: garbage bytes and a foreign id.
    garbage = b"garbage bytes here"
    await redis.hset(T_PREFIX + "bad", mapping={"msg": garbage, "state": "pending"})
    await redis.hset(T_PREFIX + "alien", mapping={"msg": bytes(make_msg("x")), "state": "pending"})
    await redis.rpush(PENDING, "alien", "bad")
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    assert got.message == good
    snap = await snapshot(redis)
    assert snap[ARCHIVED] == [(b"alien", clock.now), (b"bad", clock.now)]
    bad = snap[T_PREFIX + "bad"]
    assert bad[b"msg"] == garbage  # never rewritten, never lost
    assert bad[b"state"] == b"archived"
    assert b"cannot decode" in bad[b"asyncq_error"]
    assert b"does not match task id" in snap[T_PREFIX + "alien"][b"asyncq_error"]
    assert snap[ACTIVE] == [b"good"]
    assert snap[LEASE] == [(b"good", clock.now + 30)]
    pday, fday = daily(clock)
    assert snap[pday] == snap[fday] == snap[PROCESSED] == snap[FAILED] == b"2"
    assert await expiretime(redis, pday) == int(clock.now) + DAY90
    await assert_ids_have_hashes(redis)


async def test_dequeue_drops_id_without_hash(broker: Broker, redis: Redis) -> None:
    await broker.enqueue(make_msg("good"))
    await redis.rpush(PENDING, "ghost")
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    assert got.message.id == "good"
    assert await redis.lrange(ACTIVE, 0, -1) == [b"good"]
    assert not await redis.exists(T_PREFIX + "ghost")


# -- done / mark_as_complete -----------------------------------------------------------


async def test_done_deletes_task_counts_and_releases_lock(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    ukey = keys.unique_key(Q, "email:send", b"x")
    await broker.write(BatchItem(make_msg(payload=b"x", unique_key=ukey), unique_ttl=100))
    msg = (await transitions.dequeue(broker, [Q])).message  # type: ignore[union-attr]
    await broker.done(msg)
    pday, _ = daily(clock)
    assert await snapshot(redis) == {"asynq:queues": {b"default"}, pday: b"1", PROCESSED: b"1"}
    assert await expiretime(redis, pday) == int(clock.now) + DAY90
    assert await expiretime(redis, PROCESSED) == -1


async def test_done_keeps_lock_owned_by_another_task(broker: Broker, redis: Redis) -> None:
    ukey = keys.unique_key(Q, "email:send", b"x")
    await broker.write(BatchItem(make_msg(payload=b"x", unique_key=ukey), unique_ttl=100))
    msg = (await transitions.dequeue(broker, [Q])).message  # type: ignore[union-attr]
    await redis.set(ukey, "someone-else")
    await broker.done(msg)
    assert await redis.get(ukey) == b"someone-else"


async def test_done_counters_existing_day_and_max_int64_wrap(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    pday, _ = daily(clock)
    await redis.set(pday, 5)
    await redis.set(PROCESSED, MAXI64)
    await broker.done(await active_task(broker, make_msg()))
    assert await redis.get(pday) == b"6"
    assert await expiretime(redis, pday) == -1  # EXPIREAT only on the first INCR
    assert await redis.get(PROCESSED) == b"1"


async def test_done_not_found_changes_nothing(broker: Broker, redis: Redis) -> None:
    await broker.enqueue(make_msg())
    before = await snapshot(redis)
    with pytest.raises(TaskNotFoundError) as info:
        await broker.done(make_msg())
    assert (info.value.queue, info.value.task_id) == (Q, "t1")
    with pytest.raises(TaskNotFoundError):
        await broker.done(make_msg("missing"))
    assert await snapshot(redis) == before


async def test_mark_as_complete(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    ukey = keys.unique_key(Q, "email:send", None)
    msg = make_msg(retention=3600, unique_key=ukey)
    await broker.write(BatchItem(msg, unique_ttl=100))
    msg = (await transitions.dequeue(broker, [Q])).message  # type: ignore[union-attr]
    clock.now += 2
    await broker.mark_as_complete(msg)
    assert msg.completed_at == 0  # the caller's message is left alone
    stored = make_msg(retention=3600, unique_key=ukey, completed_at=int(clock.now))
    pday, _ = daily(clock)
    assert await snapshot(redis) == {
        "asynq:queues": {b"default"},
        T_PREFIX + "t1": {
            b"msg": bytes(stored),
            b"state": b"completed",
            b"unique_key": ukey.encode(),
        },
        COMPLETED: [(b"t1", clock.now + 3600)],
        pday: b"1",
        PROCESSED: b"1",
    }
    assert await expiretime(redis, pday) == int(clock.now) + DAY90
    before = await snapshot(redis)
    with pytest.raises(TaskNotFoundError):
        await broker.mark_as_complete(msg)
    assert await snapshot(redis) == before


# -- requeue ---------------------------------------------------------------------------


async def test_requeue_puts_task_first_in_line(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    msg = await active_task(broker, make_msg("a"))
    await broker.enqueue(make_msg("b"))
    await broker.requeue(msg)
    snap = await snapshot(redis)
    assert snap[PENDING] == [b"b", b"a"]
    assert snap[T_PREFIX + "a"] == {b"msg": bytes(msg), b"state": b"pending"}
    assert ACTIVE not in snap
    assert LEASE not in snap
    assert PROCESSED not in snap
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    assert got.message.id == "a"
    before = await snapshot(redis)
    with pytest.raises(TaskNotFoundError):
        await broker.requeue(make_msg("b"))
    assert await snapshot(redis) == before


# -- retry -----------------------------------------------------------------------------


async def test_retry_failure(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    msg = await active_task(broker, make_msg(retried=2))
    clock.now += 1
    await broker.retry(msg, clock.dt + timedelta(seconds=45), "boom", is_failure=True)
    assert msg.retried == 2
    assert msg.error_msg == ""
    stored = make_msg(retried=3, error_msg="boom", last_failed_at=int(clock.now))
    pday, fday = daily(clock)
    assert await snapshot(redis) == {
        "asynq:queues": {b"default"},
        T_PREFIX + "t1": {b"msg": bytes(stored), b"state": b"retry"},
        RETRY: [(b"t1", clock.now + 45)],
        pday: b"1",
        fday: b"1",
        PROCESSED: b"1",
        FAILED: b"1",
    }
    for key in (pday, fday):
        assert await expiretime(redis, key) == int(clock.now) + DAY90


async def test_retry_not_failure_counts_nothing(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    msg = await active_task(broker, make_msg(retried=2))
    await broker.retry(msg, clock.dt, "shutdown", is_failure=False)
    stored = make_msg(retried=2, error_msg="shutdown", last_failed_at=int(clock.now))
    assert await snapshot(redis) == {
        "asynq:queues": {b"default"},
        T_PREFIX + "t1": {b"msg": bytes(stored), b"state": b"retry"},
        RETRY: [(b"t1", clock.now)],
    }


async def test_retry_wraps_both_totals(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    await redis.set(PROCESSED, MAXI64)
    await redis.set(FAILED, 12)
    await broker.retry(await active_task(broker, make_msg()), clock.dt, "e", is_failure=True)
    assert await redis.get(PROCESSED) == b"1"
    assert await redis.get(FAILED) == b"1"


async def test_retry_not_found(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    await broker.schedule(make_msg(), clock.dt)
    before = await snapshot(redis)
    with pytest.raises(TaskNotFoundError):
        await broker.retry(make_msg(), clock.dt, "e", is_failure=True)
    assert await snapshot(redis) == before


# -- archive ---------------------------------------------------------------------------


async def test_archive(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    msg = await active_task(broker, make_msg(retried=25))
    await broker.archive(msg, "gave up")
    stored = make_msg(retried=25, error_msg="gave up", last_failed_at=int(clock.now))
    pday, fday = daily(clock)
    assert await snapshot(redis) == {
        "asynq:queues": {b"default"},
        T_PREFIX + "t1": {b"msg": bytes(stored), b"state": b"archived"},
        ARCHIVED: [(b"t1", clock.now)],
        pday: b"1",
        fday: b"1",
        PROCESSED: b"1",
        FAILED: b"1",
    }
    for key in (pday, fday):
        assert await expiretime(redis, key) == int(clock.now) + DAY90
    before = await snapshot(redis)
    with pytest.raises(TaskNotFoundError):
        await broker.archive(msg, "again")
    assert await snapshot(redis) == before


async def test_archive_trims_old_and_excess_tasks_with_their_hashes(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    now = int(clock.now)
    pipe = redis.pipeline(transaction=False)
    # Two tasks older than 90 days, one exactly at the cutoff, one just inside.
    ages = {"old1": DAY90 + 100, "old2": DAY90 + 1, "edge": DAY90, "young": DAY90 - 1}
    for tid, age in ages.items():
        pipe.hset(T_PREFIX + tid, mapping={"msg": b"m", "state": "archived"})
        pipe.zadd(ARCHIVED, {tid: now - age})
    await pipe.execute()
    # 9,998 recent archived tasks (written server-side, it is faster): with the new one
    # and "young" that makes 10,000.
    fill = """
    for i = 0, 9997 do
        local id = string.format("r%05d", i)
        redis.call("HSET", ARGV[1] .. id, "msg", "m", "state", "archived")
        redis.call("ZADD", KEYS[1], ARGV[2], id)
    end
    """
    await redis.eval(fill, 1, ARCHIVED, T_PREFIX, now - 10)  # type: ignore[misc]
    msg = await active_task(broker, make_msg())
    await broker.archive(msg, "e")
    for tid in ("old1", "old2", "edge"):
        assert not await redis.exists(T_PREFIX + tid)
    # Of 10,000 left, ZRANGE 0 -10000 trims the oldest one: asynq keeps 9,999.
    assert await redis.zcard(ARCHIVED) == 9999
    assert not await redis.exists(T_PREFIX + "young")
    assert await redis.zscore(ARCHIVED, "t1") == clock.now
    assert await redis.hget(T_PREFIX + "t1", "state") == b"archived"
    assert await redis.exists(T_PREFIX + "r00000")
    await assert_ids_have_hashes(redis)


async def test_archive_keeps_the_task_it_archives_when_it_falls_in_the_excess(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # 10,000 tasks archived in the same second with ids sorting after t1 (or later, by
    # a clock ahead): t1 is the lowest of the set, in the range the size trim takes,
    # and stays archived all the same; the next lowest goes instead.
    fill = """
    for i = 0, 9999 do
        local id = string.format("u%05d", i)
        redis.call("HSET", ARGV[1] .. id, "msg", "m", "state", "archived")
        redis.call("ZADD", KEYS[1], ARGV[2], id)
    end
    """
    await redis.eval(fill, 1, ARCHIVED, T_PREFIX, int(clock.now))  # type: ignore[misc]
    await broker.archive(await active_task(broker, make_msg()), "e")
    assert await redis.zscore(ARCHIVED, "t1") == clock.now
    assert await redis.hget(T_PREFIX + "t1", "state") == b"archived"
    assert await redis.zcard(ARCHIVED) == 10000
    assert await redis.zscore(ARCHIVED, "u00000") is None
    assert not await redis.exists(T_PREFIX + "u00000")
    await assert_ids_have_hashes(redis)


async def test_archive_trims_tasks_older_than_90_days_from_a_small_archive(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # Far under the size limit: only the age trims (the size trim above would hide it).
    now = int(clock.now)
    for tid, age in {"old": DAY90 + 1, "young": DAY90 - 1}.items():
        await redis.hset(T_PREFIX + tid, mapping={"msg": b"m", "state": "archived"})
        await redis.zadd(ARCHIVED, {tid: now - age})
    await broker.archive(await active_task(broker, make_msg()), "e")
    assert await redis.zrange(ARCHIVED, 0, -1) == [b"young", b"t1"]
    assert not await redis.exists(T_PREFIX + "old")
    assert await redis.exists(T_PREFIX + "young")


# -- forward ---------------------------------------------------------------------------


async def test_forward_moves_due_tasks(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    due, later = make_msg("due"), make_msg("later")
    await broker.schedule(due, clock.dt)
    await broker.schedule(later, clock.dt + timedelta(seconds=1))
    retry_msg = await active_task(broker, make_msg("r"))
    await broker.retry(retry_msg, clock.dt - timedelta(seconds=5), "e", is_failure=False)
    clock.now += 0.5
    assert await transitions.forward_if_ready(broker, [Q, "empty"]) == 2
    snap = await snapshot(redis)
    assert snap[PENDING] == [b"r", b"due"]
    assert snap[SCHEDULED] == [(b"later", clock.now - 0.5 + 1)]
    assert RETRY not in snap
    assert snap[T_PREFIX + "due"] == {
        b"msg": bytes(due),
        b"state": b"pending",
        b"pending_since": str(int(clock.now * NS)).encode(),
    }
    assert snap[T_PREFIX + "r"][b"state"] == b"pending"
    assert await transitions.forward_if_ready(broker, [Q]) == 0


async def test_forward_loops_over_batches_of_100(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    for i in range(250):
        await broker.schedule(make_msg(f"s{i}"), clock.dt)
    assert await transitions.forward_if_ready(broker, [Q]) == 250
    assert await redis.llen(PENDING) == 250
    assert not await redis.exists(SCHEDULED)


async def test_forward_returns_grouped_task_to_its_group(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await broker.write(BatchItem(make_msg("g1"), group="grp"))
    await redis.srem("asynq:{default}:groups", "grp")
    # A grouped task that was run by hand and then failed comes back through retry.
    await redis.zrem("asynq:{default}:g:grp", "g1")
    await redis.zadd(RETRY, {"g1": clock.now - 1})
    await redis.hset(T_PREFIX + "g1", "state", "retry")
    assert await transitions.forward_if_ready(broker, [Q]) == 1
    snap = await snapshot(redis)
    assert snap["asynq:{default}:g:grp"] == [(b"g1", clock.now)]
    assert snap[T_PREFIX + "g1"][b"state"] == b"aggregating"
    assert snap["asynq:{default}:groups"] == {b"grp"}
    assert PENDING not in snap


async def test_forward_drops_ids_without_hash(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await redis.zadd(SCHEDULED, {"ghost": clock.now})
    await broker.schedule(make_msg("real"), clock.dt)
    assert await transitions.forward_if_ready(broker, [Q]) == 2
    assert await redis.lrange(PENDING, 0, -1) == [b"real"]
    assert not await redis.exists(T_PREFIX + "ghost")
    assert not await redis.exists(SCHEDULED)


# -- leases ----------------------------------------------------------------------------


async def test_list_lease_expired(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    early = await active_task(broker, make_msg("early"))
    clock.now += 10
    await active_task(broker, make_msg("late"))
    cutoff = clock.dt - timedelta(seconds=10) + timedelta(seconds=LEASE_DURATION)
    assert await transitions.list_lease_expired(broker, cutoff, [Q, "other"]) == [early]
    assert (
        len(await transitions.list_lease_expired(broker, clock.dt + timedelta(minutes=1), [Q])) == 2
    )
    assert await transitions.list_lease_expired(broker, clock.dt, [Q]) == []
    assert await redis.zcard(LEASE) == 2


async def test_list_lease_expired_archives_undecodable(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    good = await active_task(broker, make_msg("good"))
    await redis.hset(T_PREFIX + "bad", mapping={"msg": b"\xff\x01", "state": "active"})
    await redis.lpush(ACTIVE, "bad")
    await redis.zadd(LEASE, {"bad": clock.now})
    got = await transitions.list_lease_expired(broker, clock.dt + timedelta(minutes=1), [Q])
    assert got == [good]
    assert await redis.zrange(ARCHIVED, 0, -1) == [b"bad"]
    assert await redis.lrange(ACTIVE, 0, -1) == [b"good"]
    assert await redis.zrange(LEASE, 0, -1) == [b"good"]
    assert await redis.hget(T_PREFIX + "bad", "msg") == b"\xff\x01"


FILL = """
for i = 0, tonumber(ARGV[4]) - 1 do
    local id = string.format(ARGV[3], i)
    redis.call("HSET", ARGV[1] .. id, "msg", "m", "state", "archived")
    redis.call("ZADD", KEYS[1], ARGV[2], id)
end
"""


@pytest.mark.parametrize("source", ["active", "group"])
@pytest.mark.parametrize("fill", ["none", "older", "same second"])
async def test_archive_undecodable_trims_as_archive_does(
    broker: Broker, redis: Redis, clock: FakeClock, source: str, fill: str
) -> None:
    # The age trim (older than 90 days, the cutoff itself included) and the size
    # trim, never the task being archived: with 10,000 tasks archived in the same
    # second and ids sorting after "bad", "bad" lies in the size trim's range.
    now = int(clock.now)
    for tid, age in {"old": DAY90 + 1, "edge": DAY90, "young": DAY90 - 1}.items():
        await redis.hset(T_PREFIX + tid, mapping={"msg": b"m", "state": "archived"})
        await redis.zadd(ARCHIVED, {tid: now - age})
    if fill == "older":  # with "young" and "bad": 10,000, and the oldest ("young") goes
        await redis.eval(FILL, 1, ARCHIVED, T_PREFIX, now - 10, "r%05d", 9998)  # type: ignore[misc]
    elif fill == "same second":  # "young" and "u00000" go
        await redis.eval(FILL, 1, ARCHIVED, T_PREFIX, now, "u%05d", 10000)  # type: ignore[misc]
    await redis.hset(T_PREFIX + "bad", mapping={"msg": b"\xff\x01", "state": "active"})
    qk = broker._q(Q)
    if source == "active":
        src = ACTIVE
        await redis.lpush(ACTIVE, "bad", "bad")  # a second copy: both go
        await redis.zadd(LEASE, {"bad": clock.now})
    else:
        src = keys.group_key(Q, "g")
        await redis.zadd(src, {"bad": clock.now})
    await broker._archive_undecodable(qk, "bad", "err", clock.now, src)
    assert await redis.zscore(ARCHIVED, "bad") == now
    assert await redis.hgetall(T_PREFIX + "bad") == {
        b"msg": b"\xff\x01",
        b"state": b"archived",
        b"asyncq_error": b"err",
    }
    # without a fill only the age trim takes any ("young" is a second inside the limit)
    for tid in ("old", "edge", "young") if fill != "none" else ("old", "edge"):
        assert not await redis.exists(T_PREFIX + tid)
        assert await redis.zscore(ARCHIVED, tid) is None
    assert await redis.zcard(ARCHIVED) == {"none": 2, "older": 9999, "same second": 10000}[fill]
    if fill == "same second":
        assert not await redis.exists(T_PREFIX + "u00000")
    await assert_ids_have_hashes(redis)
    assert await redis.exists(src, LEASE) == 0
    counted = [PROCESSED, FAILED, *daily(clock)]
    if source == "active":
        assert await redis.mget(counted) == [b"1"] * 4
        assert await expiretime(redis, daily(clock)[1]) == now + DAY90
    else:
        assert await redis.exists(*counted) == 0
    # not in its source any more: the second call changes nothing
    watched = [T_PREFIX + "bad", ARCHIVED, src, LEASE, *counted]
    before = [await redis.dump(k) for k in watched]
    await broker._archive_undecodable(qk, "bad", "again", clock.now, src)
    assert [await redis.dump(k) for k in watched] == before


async def test_extend_lease_updates_only_existing(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await active_task(broker, make_msg("a"))
    clock.now += 20.5
    expiry = await broker.extend_lease(Q, ["a", "gone"])
    assert expiry == clock.now + LEASE_DURATION
    assert await redis.zrange(LEASE, 0, -1, withscores=True) == [(b"a", int(clock.now) + 30)]
    assert await broker.extend_lease(Q, []) == clock.now + LEASE_DURATION


# -- janitor and results -----------------------------------------------------------------


async def test_delete_expired_completed_tasks(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    for i in range(5):
        msg = await active_task(broker, make_msg(f"e{i}", retention=10))
        await broker.mark_as_complete(msg)
    keep = await active_task(broker, make_msg("keep", retention=100))
    await broker.mark_as_complete(keep)
    clock.now += 10
    assert await transitions.delete_expired_completed_tasks(broker, Q, batch_size=2) == 5
    assert await redis.zrange(COMPLETED, 0, -1) == [b"keep"]
    assert [k for k in await redis.keys(T_PREFIX + "*")] == [(T_PREFIX + "keep").encode()]
    assert await transitions.delete_expired_completed_tasks(broker, Q) == 0
    with pytest.raises(ValueError, match="batch_size"):
        await transitions.delete_expired_completed_tasks(broker, Q, 0)


async def test_write_result(broker: Broker, redis: Redis) -> None:
    await active_task(broker, make_msg())
    assert await broker.write_result(Q, "t1", b"\x00result") == 7
    assert await redis.hget(T_PREFIX + "t1", "result") == b"\x00result"


# -- round trip ------------------------------------------------------------------------

_text = st.text(max_size=20)
_messages = st.builds(
    TaskMessage,
    type=st.text(min_size=1, max_size=30),
    payload=st.binary(max_size=300),
    id=st.text(min_size=1, max_size=40),
    # Queue names holding braces are refused (they would break the key schema).
    queue=st.text(min_size=1, max_size=20).filter(
        lambda q: q.strip() != "" and "{" not in q and "}" not in q
    ),
    retry=st.integers(0, 2**31 - 1),
    retried=st.integers(0, 2**31 - 1),
    error_msg=_text,
    timeout=st.integers(0, 2**63 - 1),
    deadline=st.integers(0, 2**63 - 1),
    unique_key=_text,
    last_failed_at=st.integers(0, 2**63 - 1),
    retention=st.integers(0, 2**63 - 1),
    completed_at=st.integers(0, 2**63 - 1),
    group_key=_text,
    headers=st.dictionaries(_text, _text, max_size=4),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(msg=_messages)
async def test_enqueue_dequeue_round_trip_is_byte_identical(
    broker: Broker, redis: Redis, msg: TaskMessage
) -> None:
    await redis.flushdb()
    encoded = bytes(msg)
    await broker.enqueue(msg)
    assert await redis.hget(keys.task_key(msg.queue, msg.id), "msg") == encoded
    got = await transitions.dequeue(broker, [msg.queue])
    assert got is not None
    assert got.message == msg
    assert bytes(got.message) == encoded
    assert await redis.hget(keys.task_key(msg.queue, msg.id), "msg") == encoded


async def test_lease_duration_is_configurable(redis: Redis) -> None:
    broker = Broker(redis, clock=lambda: 1_000.0, lease_duration=2.0)
    msg = TaskMessage(type="t", id="lease-id", queue="default", retry=1)
    await broker.enqueue(msg)
    [task] = await transitions.dequeue_many(broker, ["default"], 1)
    assert task.lease_expiry == 1_002.0
    assert await redis.zscore(keys.lease_key("default"), "lease-id") == 1_002.0
    assert await broker.extend_lease("default", ["lease-id"]) == 1_002.0
    with pytest.raises(ValueError, match="lease_duration"):
        Broker(redis, lease_duration=0)


# -- the recoverer's conditional writes ---------------------------------------------------
# Recoverers of several workers wake at the same lease expiry. The first one's retry can be
# forwarded and leased again by a worker before a second recoverer's write for the same
# (stale) scan lands: that write must not take the task from its new run. The chaos crash
# storm ran such a task twice at once before the writes became conditional.


@pytest.mark.parametrize("how", ["retry", "archive"])
async def test_a_recoverer_write_leaves_a_task_leased_again(
    broker: Broker, redis: Redis, clock: FakeClock, how: str
) -> None:
    msg = await active_task(broker, make_msg())
    lease_end = await redis.zscore(LEASE, "t1")
    assert lease_end is not None
    cutoff = lease_end - 1  # the scan's cutoff was before this (fresh) lease ends
    before = await snapshot(redis)
    with pytest.raises(TaskNotFoundError):
        if how == "retry":
            await broker.retry(msg, clock.dt, "lease", is_failure=True, lease_expired_by=cutoff)
        else:
            await broker.archive(msg, "lease", lease_expired_by=cutoff)
    assert await snapshot(redis) == before  # still active, its lease untouched


@pytest.mark.parametrize("how", ["retry", "archive"])
async def test_a_recoverer_write_takes_a_task_whose_lease_ended(
    broker: Broker, redis: Redis, clock: FakeClock, how: str
) -> None:
    msg = await active_task(broker, make_msg())
    lease_end = await redis.zscore(LEASE, "t1")
    assert lease_end is not None
    if how == "retry":
        await broker.retry(msg, clock.dt, "lease", is_failure=True, lease_expired_by=lease_end)
        assert await redis.zscore(RETRY, "t1") is not None
    else:
        await broker.archive(msg, "lease", lease_expired_by=lease_end)
        assert await redis.zscore(ARCHIVED, "t1") is not None
    assert await redis.llen(ACTIVE) == 0
    assert await redis.zcard(LEASE) == 0


# -- an id listed twice in active --------------------------------------------------------


@pytest.mark.parametrize(
    "leave", ["done", "done_many", "mark_as_complete", "requeue", "retry", "archive"]
)
async def test_leaving_active_removes_every_copy_of_the_id(
    broker: Broker, redis: Redis, clock: FakeClock, leave: str
) -> None:
    # asynq's scripts remove a task from active with LREM count 0: every copy of its id
    # goes, so a list holding it twice (written by hand or by an older tool) is cleaned
    # as the task leaves, and no copy is left behind for the recoverer to find.
    msg = await active_task(broker, make_msg(retention=60 if leave == "mark_as_complete" else 0))
    await redis.rpush(ACTIVE, "other", msg.id)
    if leave == "done":
        await broker.done(msg)
    elif leave == "done_many":
        assert await transitions.done_many(broker, [msg]) == [None]
    elif leave == "mark_as_complete":
        await broker.mark_as_complete(msg)
    elif leave == "requeue":
        await broker.requeue(msg)
    elif leave == "retry":
        await broker.retry(msg, clock.dt, "e", is_failure=True)
    else:
        await broker.archive(msg, "e")
    assert await redis.lrange(ACTIVE, 0, -1) == [b"other"]
