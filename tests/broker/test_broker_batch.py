"""Batched acknowledgement: Broker.ack_many (done_many / mark_as_complete_many of
tests/support/transitions.py call it).

The reference is the single-task path: the same tasks acknowledged one by one
with done() / mark_as_complete() on the same starting state must leave exactly
the same Redis state (keys, values, hash fields, counters, expiries) and give
the same per-task outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from asyncq import _keys as keys
from asyncq._broker import Broker, processing
from asyncq._redis.scripts import load_script
from asyncq.errors import BrokerError, TaskNotFoundError
from asyncq.proto.asynq import TaskMessage
from tests.support import transitions
from tests.support.helpers import FakeClock, assert_ids_have_hashes, expiretime, make_msg

MAXI64 = 9223372036854775807
DAY90 = 90 * 24 * 3600
QUEUES = ("default", "low", "x:y")
LEASE_EXPIRY = 1_900_000_000
LOCK_EXPIRY = 1_900_000_100

# Where a task is before it is acknowledged.
WHERE = (
    "active",  # in active, leased, with its hash: the normal case
    "pending",  # never dequeued
    "missing",  # no trace at all
    "no_lease",  # in active with its hash, lease gone (LREM happens, then NOT FOUND)
    "no_hash",  # in active and leased, hash gone
    "in_completed",  # active, but the id is already in completed (INTERNAL for complete)
)


@dataclass(frozen=True)
class Spec:
    """One task of a scenario: its message and where it sits beforehand."""

    msg: TaskMessage
    where: str
    lock_holder: str | None  # value of msg.unique_key beforehand (None = no lock key)


async def expiry(r: Redis, key: str | bytes) -> int:
    """Absolute expiry (unix s); -1 = no TTL, -2 = no key."""
    return await expiretime(r, key)


async def get_int(r: Redis, key: str) -> int:
    value = await r.get(key)
    assert isinstance(value, bytes), (key, value)
    return int(value)


async def state(r: Redis) -> dict[str, Any]:
    """Every key with its full value and absolute expiry (-1 = none)."""
    out: dict[str, Any] = {}
    for raw in sorted(await r.keys("*")):
        assert isinstance(raw, bytes)
        kind = await r.type(raw)
        assert isinstance(kind, bytes)
        kind = kind.decode()
        value: Any
        if kind == "string":
            value = await r.get(raw)
        elif kind == "hash":
            value = await r.hgetall(raw)
        elif kind == "list":
            value = await r.lrange(raw, 0, -1)
        elif kind == "zset":
            value = await r.zrange(raw, 0, -1, withscores=True)
        elif kind == "set":
            value = await r.smembers(raw)
        else:  # pragma: no cover - nothing else is written here
            raise AssertionError(f"unexpected type {kind} for {raw!r}")
        out[raw.decode()] = (value, await expiry(r, raw))
    return out


async def setup(
    r: Redis,
    specs: list[Spec],
    counters: dict[str, tuple[int | None, int | None]],
    when: datetime,
) -> None:
    """Write the scenario directly (deterministic expiries, no real-clock TTLs)."""
    await r.flushdb()
    pipe = r.pipeline(transaction=False)
    for spec in specs:
        msg, q = spec.msg, spec.msg.queue
        tkey = keys.task_key(q, msg.id)
        if spec.where != "missing":
            state_name = "pending" if spec.where == "pending" else "active"
            if spec.where != "no_hash":
                pipe.hset(tkey, mapping={"msg": bytes(msg), "state": state_name})
            if spec.where == "pending":
                pipe.lpush(keys.pending_key(q), msg.id)
            else:
                pipe.lpush(keys.active_key(q), msg.id)
                if spec.where != "no_lease":
                    pipe.zadd(keys.lease_key(q), {msg.id: LEASE_EXPIRY})
                if spec.where == "in_completed":
                    pipe.zadd(keys.completed_key(q), {msg.id: 1})
        if msg.unique_key and spec.lock_holder is not None:
            pipe.set(msg.unique_key, spec.lock_holder)
            pipe.expireat(msg.unique_key, LOCK_EXPIRY)
    for q, (total, daily) in counters.items():
        if total is not None:
            pipe.set(keys.processed_total_key(q), total)
        if daily is not None:
            pipe.set(keys.processed_key(q, when), daily)
    await pipe.execute()


def outcome(result: BaseException | None) -> tuple[str, str] | None:
    if result is None:
        return None
    if isinstance(result, TaskNotFoundError):
        return ("TaskNotFoundError", f"{result.queue}/{result.task_id}")
    return (type(result).__name__, "")


async def one_by_one(broker: Broker, items: list[tuple[TaskMessage, bool]]) -> list[Any]:
    out: list[Any] = []
    for msg, complete in items:
        try:
            if complete:
                await broker.mark_as_complete(msg)
            else:
                await broker.done(msg)
        except (TaskNotFoundError, BrokerError) as exc:
            out.append(outcome(exc))
        else:
            out.append(None)
    return out


async def assert_same_as_one_by_one(
    broker: Broker,
    redis: Redis,
    clock: FakeClock,
    specs: list[Spec],
    items: list[tuple[TaskMessage, bool]],
    counters: dict[str, tuple[int | None, int | None]] | None = None,
) -> list[Exception | None]:
    counters = counters or {}
    await setup(redis, specs, counters, clock.dt)
    expected_results = await one_by_one(broker, items)
    expected = await state(redis)
    await setup(redis, specs, counters, clock.dt)
    results = await broker.ack_many(items)
    assert [outcome(r) for r in results] == expected_results
    assert await state(redis) == expected
    return results


def task(tid: str, queue: str = "default", **fields: Any) -> TaskMessage:
    return make_msg(tid, queue=queue, **fields)


def active(*msgs: TaskMessage) -> list[Spec]:
    return [Spec(m, "active", m.id if m.unique_key else None) for m in msgs]


# -- examples --------------------------------------------------------------------------


async def test_done_many_deletes_tasks_counts_and_releases_locks(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    ukey = keys.unique_key("default", "email:send", b"u")
    msgs = [task("a"), task("b", unique_key=ukey), task("c", retention=60)]
    results = await assert_same_as_one_by_one(
        broker, redis, clock, active(*msgs), [(m, False) for m in msgs]
    )
    assert results == [None, None, None]
    pday = keys.processed_key("default", clock.dt)
    # done ignores retention (as asynq's Done does): everything is gone.
    assert await state(redis) == {
        pday: (b"3", int(clock.now) + DAY90),
        keys.processed_total_key("default"): (b"3", -1),
    }
    # done_many is the same call.
    await setup(redis, active(*msgs), {}, clock.dt)
    assert await transitions.done_many(broker, msgs) == [None, None, None]
    assert await redis.get(pday) == b"3"


async def test_mark_as_complete_many_keeps_tasks_for_their_retention(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    ukey = keys.unique_key("default", "email:send", None)
    msgs = [task("a", retention=60), task("b", retention=3600, unique_key=ukey)]
    await setup(redis, active(*msgs), {}, clock.dt)
    assert await transitions.mark_as_complete_many(broker, msgs) == [None, None]
    assert [m.completed_at for m in msgs] == [0, 0]  # the caller's messages are left alone
    now = int(clock.now)
    snap = await state(redis)
    assert snap[keys.completed_key("default")] == ([(b"a", now + 60), (b"b", now + 3600)], -1)
    for msg in msgs:
        stored = make_msg(msg.id, retention=msg.retention, unique_key=msg.unique_key)
        stored.completed_at = now
        assert snap[keys.task_key("default", msg.id)] == (
            {b"msg": bytes(stored), b"state": b"completed"},
            -1,
        )
    assert ukey not in snap
    assert keys.active_key("default") not in snap
    assert keys.lease_key("default") not in snap
    await assert_ids_have_hashes(redis)
    # And exactly what mark_as_complete would have written.
    await assert_same_as_one_by_one(broker, redis, clock, active(*msgs), [(m, True) for m in msgs])


async def test_mixed_batch_not_found_items_leave_others_acknowledged(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    good, kept = task("good"), task("kept", retention=10)
    specs = [
        *active(good, kept),
        Spec(task("pend"), "pending", None),
        Spec(task("gone"), "missing", None),
        Spec(task("nolease"), "no_lease", None),
        Spec(task("nohash"), "no_hash", None),
        Spec(task("twice", retention=5), "in_completed", None),
    ]
    items = [(s.msg, s.msg.retention > 0) for s in specs] + [(good, False)]
    results = await assert_same_as_one_by_one(broker, redis, clock, specs, items)
    assert [outcome(r) for r in results] == [
        None,
        None,
        ("TaskNotFoundError", "default/pend"),
        ("TaskNotFoundError", "default/gone"),
        ("TaskNotFoundError", "default/nolease"),
        ("TaskNotFoundError", "default/nohash"),
        ("BrokerError", ""),  # asynq's INTERNAL: completed already holds the id
        ("TaskNotFoundError", "default/good"),  # acknowledged once only
    ]
    assert "INTERNAL" in str(results[6])
    assert await redis.get(keys.processed_total_key("default")) == b"2"


async def test_unique_locks_released_only_when_owned(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    def ukey(n: int) -> str:
        return keys.unique_key("default", "email:send", str(n).encode())

    mine, other = task("m", unique_key=ukey(1)), task("o", unique_key=ukey(2))
    absent = task("x", unique_key=ukey(3), retention=30)
    specs = [Spec(mine, "active", "m"), Spec(other, "active", "z"), Spec(absent, "active", None)]
    items = [(mine, False), (other, False), (absent, True)]
    assert await assert_same_as_one_by_one(broker, redis, clock, specs, items) == [None] * 3
    assert not await redis.exists(ukey(1))
    assert await redis.get(ukey(2)) == b"z"
    assert await expiry(redis, ukey(2)) == LOCK_EXPIRY
    assert not await redis.exists(ukey(3))


async def test_unique_key_outside_the_queue_falls_back_to_single_call(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # Not written by asynq or asyncq, but a hand-made message may carry any key:
    # the script must not touch a key of another slot, the single call declares it.
    stray = task("s", unique_key="elsewhere:lock")
    plain = task("p")
    specs = [Spec(stray, "active", "s"), Spec(plain, "active", None)]
    items = [(stray, False), (plain, False)]
    assert await assert_same_as_one_by_one(broker, redis, clock, specs, items) == [None, None]
    assert not await redis.exists("elsewhere:lock")


async def run_script(redis: Redis, kinds: str, *task_args: str) -> Any:
    q = "default"
    return await load_script("asyncq._broker", "ack_many")(
        redis,
        (keys.active_key(q), keys.lease_key(q), keys.completed_key(q), "pday", "ptotal"),
        (keys.task_key_prefix(q), keys.queue_key_prefix(q), 1, MAXI64, kinds, *task_args),
    )


async def test_script_refuses_unique_key_outside_the_queue(redis: Redis) -> None:
    # The script's own guard, for callers that skip the Python check.
    await redis.rpush(keys.active_key("default"), "s")
    await redis.zadd(keys.lease_key("default"), {"s": 1})
    await redis.set("elsewhere:lock", "s")
    assert await run_script(redis, "D", "s", "elsewhere:lock") == [-2]
    assert await redis.lrange(keys.active_key("default"), 0, -1) == [b"s"]
    assert await redis.get("elsewhere:lock") == b"s"
    assert not await redis.exists("pday", "ptotal")


async def test_script_never_reads_a_unique_key_outside_the_queue(redis: Redis) -> None:
    # Not even its type: the key may live in another slot, so a hash there refuses the
    # task (-2), not the whole call, and the task beside it is acknowledged.
    await redis.rpush(keys.active_key("default"), "s", "p")
    await redis.zadd(keys.lease_key("default"), {"s": 1, "p": 1})
    await redis.hset(keys.task_key("default", "p"), "msg", "m")
    await redis.hset("elsewhere:lock", "x", "y")
    assert await run_script(redis, "Dd", "s", "elsewhere:lock", "p") == [-2, 1]
    assert await redis.lrange(keys.active_key("default"), 0, -1) == [b"s"]
    assert await redis.hgetall("elsewhere:lock") == {b"x": b"y"}
    assert await redis.get("ptotal") == b"1"


async def test_script_rejects_arguments_not_matching_kinds(redis: Redis) -> None:
    with pytest.raises(ResponseError, match="do not match"):
        await run_script(redis, "dd", "a")
    with pytest.raises(ResponseError, match="do not match"):
        await run_script(redis, "c", "a", "1", "msg", "extra")
    with pytest.raises(ResponseError, match="unknown task kind"):
        await run_script(redis, "x", "a")
    assert await redis.dbsize() == 0


async def test_several_queues_take_one_script_call(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    msgs = [task(f"{q}-{i}", queue=q, retention=i) for q in QUEUES for i in range(3)]
    await setup(redis, active(*msgs), {}, clock.dt)
    await processing._ACK_QUEUES.load(redis)  # count the call, not a reload (both variants)
    before = await redis.info("commandstats")
    results = await broker.ack_many([(m, m.retention > 0) for m in msgs])
    after = await redis.info("commandstats")
    assert results == [None] * len(msgs)
    # ack_queues.lua: every queue's ack_many in one call (a cluster pipelines one per queue).
    calls = [stats.get("cmdstat_evalsha", {}).get("calls", 0) for stats in (before, after)]
    assert calls[1] - calls[0] == 1
    for q in QUEUES:
        assert await redis.get(keys.processed_total_key(q)) == b"3"
        assert await redis.zcard(keys.completed_key(q)) == 2
    await assert_same_as_one_by_one(
        broker, redis, clock, active(*msgs), [(m, m.retention > 0) for m in msgs]
    )


@pytest.mark.parametrize("several_queues", [False, True])
async def test_reloads_script_after_flush(
    broker: Broker, redis: Redis, clock: FakeClock, several_queues: bool
) -> None:
    queues = QUEUES if several_queues else ("default",)
    msgs = [task(f"{q}-t", queue=q) for q in queues]
    await setup(redis, active(*msgs), {}, clock.dt)
    await redis.script_flush()
    assert await transitions.done_many(broker, msgs) == [None] * len(msgs)
    for q in queues:
        assert await redis.get(keys.processed_total_key(q)) == b"1"


@pytest.mark.parametrize("start", [MAXI64 - 3, MAXI64 - 1, MAXI64, 10**17 - 2, 10**18])
async def test_total_counter_wraps_at_max_int64(
    broker: Broker, redis: Redis, clock: FakeClock, start: int
) -> None:
    msgs = [task(f"t{i}", retention=i % 2) for i in range(5)]
    items = [(m, m.retention > 0) for m in msgs]
    counters: dict[str, tuple[int | None, int | None]] = {"default": (start, None)}
    await assert_same_as_one_by_one(broker, redis, clock, active(*msgs), items, counters)
    total = await get_int(redis, keys.processed_total_key("default"))
    assert total == (start + 5 - MAXI64 if start + 5 > MAXI64 else start + 5)


@pytest.mark.parametrize("daily", [None, -3, -2, -1, 0, 1, 4])
async def test_daily_counter_expiry_set_when_it_reaches_one(
    broker: Broker, redis: Redis, clock: FakeClock, daily: int | None
) -> None:
    msgs = [task(f"t{i}") for i in range(3)]
    counters: dict[str, tuple[int | None, int | None]] = {"default": (None, daily)}
    await assert_same_as_one_by_one(
        broker, redis, clock, active(*msgs), [(m, False) for m in msgs], counters
    )
    pday = keys.processed_key("default", clock.dt)
    crosses_one = daily is None or -3 < daily <= 0
    expected = int(clock.now) + DAY90 if crosses_one else -1
    assert await expiry(redis, pday) == expected


async def test_script_error_fails_only_that_queues_items(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    ok, bad = task("ok", queue="default"), task("bad", queue="low")
    await setup(redis, active(ok, bad), {}, clock.dt)
    await redis.rpush(keys.processed_total_key("low"), "not a counter")
    results = await transitions.done_many(broker, [ok, bad])
    assert results[0] is None
    assert isinstance(results[1], BrokerError)
    assert "low" in str(results[1])
    assert "WRONGTYPE" in str(results[1])
    assert await redis.get(keys.processed_total_key("default")) == b"1"


async def test_a_command_failing_inside_one_queue_fails_only_that_queues_items(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # The active list is not checked before the first write (LREM fails on it), so
    # the error is raised inside ack_many; ack_queues returns it as that queue's
    # error reply with Redis's own message, and the other queue is acknowledged.
    ok, bad = task("ok", queue="default"), task("bad", queue="low")
    await setup(redis, active(ok, bad), {}, clock.dt)
    await redis.delete(keys.active_key("low"))
    await redis.set(keys.active_key("low"), "not a list")
    results = await transitions.done_many(broker, [ok, bad])
    assert results[0] is None
    assert isinstance(results[1], BrokerError)
    assert "low" in str(results[1])
    assert "WRONGTYPE Operation against a key holding the wrong kind of value" in str(results[1])
    assert await redis.get(keys.processed_total_key("default")) == b"1"
    assert await redis.get(keys.active_key("low")) == b"not a list"


async def test_invalid_messages_and_empty_batch(broker: Broker, redis: Redis) -> None:
    assert await broker.ack_many([]) == []
    assert await redis.dbsize() == 0
    results = await transitions.done_many(
        broker, [TaskMessage(type="x", queue="default"), task("t", queue="")]
    )
    assert [type(r) for r in results] == [ValueError, ValueError]
    assert "no id" in str(results[0])
    assert "blank queue" in str(results[1])
    assert await redis.dbsize() == 0


async def test_a_message_without_id_after_its_queue_was_met(broker: Broker, redis: Redis) -> None:
    # The batch checks a queue once; a later message of that queue still needs its id.
    results = await transitions.done_many(
        broker, [task("t", queue="default"), TaskMessage(type="x", queue="default")]
    )
    assert isinstance(results[0], TaskNotFoundError)
    assert isinstance(results[1], ValueError)
    assert "no id" in str(results[1])


async def test_round_trip_with_dequeue_many(broker: Broker, redis: Redis) -> None:
    for i in range(250):
        await broker.enqueue(task(f"t{i}", queue=QUEUES[i % 3], retention=i % 2 * 60))
    done = 0
    while got := await transitions.dequeue_many(broker, list(QUEUES), 100):
        results = await broker.ack_many([(t.message, t.message.retention > 0) for t in got])
        assert results == [None] * len(got)
        done += len(got)
    assert done == 250
    for q in QUEUES:
        assert not await redis.exists(keys.active_key(q), keys.lease_key(q))
        await assert_ids_have_hashes(redis, q)
    total = sum([await get_int(redis, keys.processed_total_key(q)) for q in QUEUES])
    assert total == 250


# -- random batches against the one-by-one reference --------------------------------------


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[list[Spec], list[tuple[TaskMessage, bool]], dict[str, tuple[int | None, int | None]]]:
    n = draw(st.integers(1, 12))
    specs: list[Spec] = []
    for i in range(n):
        q = draw(st.sampled_from(QUEUES))
        tid = f"t{i}"
        lock = draw(st.sampled_from([None, 0, 1, "stray"]))
        ukey = ""
        holder: str | None = None
        if lock == "stray":
            ukey = f"foreign:{tid}"
            holder = tid
        elif lock is not None:
            # A small pool of lock keys, so tasks share (and fight over) locks.
            ukey = keys.unique_key(q, "email:send", str(lock).encode())
            holder = draw(st.sampled_from([None, tid, "someone-else"]))
        msg = task(tid, queue=q, unique_key=ukey, retention=draw(st.sampled_from([0, 0, 30])))
        specs.append(Spec(msg, draw(st.sampled_from(WHERE)), holder))
    picks = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2 * n))
    items = [(specs[i].msg, draw(st.booleans())) for i in picks]
    counters = {
        q: (
            draw(st.sampled_from([None, 0, 41, MAXI64 - 2, MAXI64])),
            draw(st.sampled_from([None, -1, 0, 1, 7])),
        )
        for q in QUEUES
    }
    return specs, items, counters


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(scenario=scenarios())
async def test_random_batches_match_one_by_one(
    broker: Broker,
    redis: Redis,
    clock: FakeClock,
    scenario: tuple[
        list[Spec], list[tuple[TaskMessage, bool]], dict[str, tuple[int | None, int | None]]
    ],
) -> None:
    specs, items, counters = scenario
    await assert_same_as_one_by_one(broker, redis, clock, specs, items, counters)


async def test_script_refuses_a_durable_step_index_that_is_no_number(redis: Redis) -> None:
    # The script's own check, for callers that skip the Python one (is_durable_step).
    with pytest.raises(ResponseError, match="bad durable step index x"):
        await run_script(redis, "r", "s", "default", "r1", "x", "1", "2")
    assert await redis.dbsize() == 0
