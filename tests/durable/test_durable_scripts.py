"""The durable scripts at their edges, driven through the broker without a worker: each
checks its keys' types before its first write (a failed call changes nothing), a
suspension whose steps are already recorded goes straight back to pending, a signal
never overrides a wait that timed out. No test here waits: each runs scripts and reads
Redis."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import Client, Task
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker._base import ARCHIVED_EXPIRATION
from asyncq._broker.durable import (
    FAR_FUTURE,
    PENDING_RUN_KEPT,
    SignalWait,
    StepAckMode,
    SuspendPlan,
    ack_step,
    read_run,
    record_wait,
    send_signal,
    settle_run,
    start_run,
    suspend_run,
)
from asyncq._codec import decode_task_message
from asyncq._redis.options import RedisClientOpts, parse_redis_uri
from asyncq._redis.transport import FastConnection
from asyncq.errors import BrokerError, TaskIdConflictError, TaskNotFoundError
from asyncq.proto.asynq import TaskMessage
from tests.support import transitions
from tests.support.durable_scripts import active_run, step_message
from tests.support.helpers import dump_all

Q = "default"


async def test_a_suspension_parks_the_run_and_enqueues_its_steps(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    plan = SuspendPlan(
        "steps", records={"s:0": b"step a", "s:1": b"step b"},
        steps=[(0, step_message(0)), (1, step_message(1))], waits=[0, 1],
    )  # fmt: skip
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.wakeup_channel(Q))
    assert await pubsub.get_message(timeout=1) is not None  # the subscription
    assert await suspend_run(broker, run, plan) == "parked"
    note = await pubsub.get_message(timeout=1)  # the steps' queue's idle workers are told
    assert note is not None and note["data"] == Q.encode()
    await pubsub.aclose()
    assert await redis.lrange(keys.active_key(Q), 0, -1) == []
    assert await redis.zscore(keys.scheduled_key(Q), "r1") == FAR_FUTURE
    assert await redis.hget(keys.task_key(Q, "r1"), "state") == b"scheduled"
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1-1", b"r1-0"]
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    assert record[b"missing"] == b"2" and record[b"wait"] == b"0,1"
    assert record[b"state"] == b"waiting"

    # the first step's acknowledgement records it; the second's wakes the run
    for index, woke in ((0, "recorded"), (1, "woken")):
        step = await transitions.dequeue(broker, [Q])
        assert step is not None and step.message.id == f"r1-{index}"
        await redis.hset(keys.task_key(Q, step.message.id), "result", f"{index * 10}")
        assert await ack_step(broker, step.message, "complete") == woke
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    assert record[b"r:0"] == b"0" and record[b"r:1"] == b"10" and record[b"state"] == b"running"
    assert b"wait" not in record and b"missing" not in record
    assert await redis.zscore(keys.scheduled_key(Q), "r1") is None
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1"]
    assert await redis.hget(keys.task_key(Q, "r1"), "state") == b"pending"


async def test_a_batch_of_step_successes_records_them_and_wakes_the_run_once(
    redis: Redis, client: Client
) -> None:
    # The batched acknowledgement (ack_many.lua, kinds r and R) does what ack_step does
    # for each: one step done without a result (null), one complete with its result.
    broker = Broker(redis)
    run = await active_run(broker, client)
    plan = SuspendPlan("steps", steps=[(0, step_message(0)), (1, step_message(1))], waits=[0, 1])
    assert await suspend_run(broker, run, plan) == "parked"
    first = await transitions.dequeue(broker, [Q])
    second = await transitions.dequeue(broker, [Q])
    assert first is not None and second is not None
    await redis.hset(keys.task_key(Q, second.message.id), "result", "7")
    assert await broker.ack_many([(first.message, False), (second.message, True)]) == [None, None]
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    assert record[b"r:0"] == b"null" and record[b"r:1"] == b"7"
    assert record[b"state"] == b"running" and b"missing" not in record
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1"]
    assert await redis.hget(keys.task_key(Q, "r1"), "state") == b"pending"
    assert await redis.zscore(keys.completed_key(Q), second.message.id) is not None
    assert await redis.hget(keys.task_key(Q, second.message.id), "state") == b"completed"
    assert not await redis.exists(keys.task_key(Q, first.message.id))
    # acknowledged again: not active any more, the record unchanged
    again = await broker.ack_many([(second.message, True)])
    assert isinstance(again[0], TaskNotFoundError)
    assert await redis.hgetall(keys.run_key(Q, "r1")) == record


async def test_a_suspension_on_recorded_steps_goes_back_to_pending(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    await redis.hset(keys.run_key(Q, "r1"), mapping={"s:0": "step a", "r:0": "1"})
    await client.enqueue(Task("other"), task_id="other")
    plan = SuspendPlan("steps", steps=[(0, step_message(0))], waits=[0])
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.wakeup_channel(Q))
    assert await pubsub.get_message(timeout=1) is not None  # the subscription
    assert await suspend_run(broker, run, plan) == "ready"
    note = await pubsub.get_message(timeout=1)  # idle workers are told
    assert note is not None and note["data"] == Q.encode()
    await pubsub.aclose()
    # at the head of pending, as a task made pending is; the step is not enqueued
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1", b"other"]
    assert not await redis.exists(keys.task_key(Q, "r1-0"))


async def test_a_gather_of_more_steps_than_one_read_slice_reads_every_one(
    redis: Redis, client: Client
) -> None:
    # the script reads the entries in slices of 500 and writes the waits in slices: a
    # gather of 1,100 steps of which four (at both ends of the first two slices) are
    # recorded
    broker = Broker(redis)
    run = await active_run(broker, client)
    done = (499, 500, 999, 1000)
    await redis.hset(
        keys.run_key(Q, "r1"), mapping={"r:499": "4", "r:500": "5", "e:999": "x", "e:1000": "y"}
    )
    n = 1100
    plan = SuspendPlan(
        "steps", steps=[(i, step_message(i)) for i in range(n)], waits=list(range(n))
    )
    assert await suspend_run(broker, run, plan) == "parked"
    waiting = [i for i in range(n) if i not in done]
    assert await redis.llen(keys.pending_key(Q)) == n - 4
    assert not await redis.exists(*(keys.task_key(Q, f"r1-{i}") for i in done))
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    assert record[b"missing"] == str(n - 4).encode()
    assert record[b"wait"] == ",".join(map(str, waiting)).encode()
    assert sorted(int(k[2:]) for k in record if k.startswith(b"w:")) == waiting
    assert record[b"state"] == b"waiting"


async def test_a_recorded_step_is_not_enqueued_whatever_the_run_waits_for(
    redis: Redis, client: Client
) -> None:
    # the script reads whether each step to enqueue is recorded, not only the waited ones
    broker = Broker(redis)
    run = await active_run(broker, client)
    await redis.hset(keys.run_key(Q, "r1"), mapping={"s:3": "step a", "e:3": "boom"})
    plan = SuspendPlan("sleep", steps=[(3, step_message(3))], until=50.0)
    assert await suspend_run(broker, run, plan) == "parked"
    assert not await redis.exists(keys.task_key(Q, "r1-3"))
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == []


@pytest.mark.parametrize(
    "damaged",
    ["active", "lease", "run task", "pending", "run", "scheduled", "step pending", "step task",
     "awaiting", "kept"],
)  # fmt: skip
async def test_a_suspension_on_a_damaged_key_changes_nothing(
    redis: Redis, client: Client, damaged: str
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    key = {
        "active": keys.active_key(Q),
        "lease": keys.lease_key(Q),
        "run task": keys.task_key(Q, "r1"),
        "pending": keys.pending_key(Q),
        "run": keys.run_key(Q, "r1"),
        "scheduled": keys.scheduled_key(Q),
        "step pending": keys.pending_key("other"),
        "step task": keys.task_key("other", "r1-0"),
        "awaiting": keys.awaiting_key(Q, "go", "k"),
        "kept": keys.signal_key(Q, "go", "k"),
    }[damaged]
    await redis.delete(key)
    if damaged == "kept":  # a set where a string is kept
        await redis.sadd(key, "x")
    else:
        await redis.set(key, "x")
    before = await dump_all(redis)
    steps_plan = SuspendPlan("steps", steps=[(0, step_message(0, "other"))], waits=[0])
    signal_plan = SuspendPlan("signal", signal=SignalWait("go", "k", 0))
    plan = signal_plan if damaged in ("awaiting", "kept") else steps_plan
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await suspend_run(broker, run, plan)
    assert await dump_all(redis) == before


async def test_a_step_ack_on_a_damaged_record_changes_nothing(redis: Redis, client: Client) -> None:
    broker = Broker(redis)
    await client.enqueue(Task("step", b"{}"), task_id="r1-0", headers=step_message(0).headers)
    step = await transitions.dequeue(broker, [Q])
    assert step is not None
    await redis.set(keys.run_key(Q, "r1"), "x")
    before = await dump_all(redis)
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await ack_step(broker, step.message, "done")
    assert await dump_all(redis) == before


async def test_a_signal_does_not_override_a_wait_that_timed_out(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    wait = SignalWait("go", "k", 0)
    plan = SuspendPlan("signal", records={"s:0": b"wait go k"}, signal=wait, until=10.0)
    assert await suspend_run(broker, run, plan) == "parked"
    assert await redis.smembers(keys.awaiting_key(Q, "go", "k")) == {b"r1 0"}
    # the timeout is recorded first: the wait's result is None ("") for good
    assert await record_wait(redis, Q, "r1", wait, b"") == b""
    assert not await redis.exists(keys.awaiting_key(Q, "go", "k"))
    assert await send_signal(redis, Q, "go", "k", payload=b"1", keep_ms=60_000, now=0) == 0
    assert await redis.hget(keys.run_key(Q, "r1"), "r:0") == b""
    assert await redis.get(keys.signal_key(Q, "go", "k")) == b"1"  # kept for a later wait
    # and a signal recorded first stands against a later timeout
    await redis.hset(keys.run_key(Q, "r1"), "r:1", b'"yes"')
    wait1 = SignalWait("go", "k", 1)
    assert await record_wait(redis, Q, "r1", wait1, b"") == b'"yes"'


@pytest.mark.parametrize("damaged", ["record", "awaiting"])
async def test_recording_a_wait_on_a_damaged_key_changes_nothing(
    redis: Redis, damaged: str
) -> None:
    wait = SignalWait("go", "k", 0)
    await redis.hset(keys.run_key(Q, "r1"), "s:0", "wait go k")
    await redis.sadd(keys.awaiting_key(Q, "go", "k"), "r1 0")
    key = keys.run_key(Q, "r1") if damaged == "record" else keys.awaiting_key(Q, "go", "k")
    await redis.delete(key)
    await redis.set(key, "x")
    before = await dump_all(redis)
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await record_wait(redis, Q, "r1", wait, b"")
    assert await dump_all(redis) == before


@pytest.mark.parametrize(
    "damaged", ["awaiting", "kept", "scheduled", "pending", "waiting run", "waiting task"]
)
async def test_a_signal_on_a_damaged_key_changes_nothing(
    redis: Redis, client: Client, damaged: str
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    plan = SuspendPlan("signal", records={"s:0": b"wait go k"}, signal=SignalWait("go", "k", 0))
    assert await suspend_run(broker, run, plan) == "parked"
    key = {
        "awaiting": keys.awaiting_key(Q, "go", "k"),
        "kept": keys.signal_key(Q, "go", "k"),
        "scheduled": keys.scheduled_key(Q),
        "pending": keys.pending_key(Q),
        "waiting run": keys.run_key(Q, "r1"),
        "waiting task": keys.task_key(Q, "r1"),
    }[damaged]
    await redis.delete(key)
    if damaged == "kept":  # a list where a string is kept
        await redis.rpush(key, "x")
    else:
        await redis.set(key, "x")
    before = await dump_all(redis)
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await send_signal(redis, Q, "go", "k", payload=b"1", keep_ms=60_000, now=0)
    assert await dump_all(redis) == before


@pytest.mark.parametrize(
    "damaged",
    ["active", "lease", "task", "processed day", "processed", "completed", "archived",
     "failed day", "failed", "run", "scheduled", "pending", "run task"],
)  # fmt: skip
async def test_a_step_ack_on_any_damaged_key_changes_nothing(
    redis: Redis, client: Client, damaged: str
) -> None:
    broker = Broker(redis)
    await client.enqueue(Task("step", b"{}"), task_id="r1-0", headers=step_message(0).headers)
    step = await transitions.dequeue(broker, [Q])
    assert step is not None
    await redis.hset(keys.run_key(Q, "r1"), mapping={"s:0": "step", "w:0": "1", "missing": "1"})
    await redis.hset(keys.task_key(Q, "r1"), mapping={"state": "scheduled"})
    await redis.zadd(keys.scheduled_key(Q), {"r1": FAR_FUTURE})
    qk = broker._q(Q)
    key = {
        "active": qk.active,
        "lease": qk.lease,
        "task": keys.task_key(Q, "r1-0"),
        "processed day": qk.daily(broker.clock())[0],
        "processed": qk.processed,
        "completed": qk.completed,
        "archived": qk.archived,
        "failed day": qk.daily(broker.clock())[1],
        "failed": qk.failed,
        "run": keys.run_key(Q, "r1"),
        "scheduled": keys.scheduled_key(Q),
        "pending": keys.pending_key(Q),
        "run task": keys.task_key(Q, "r1"),
    }[damaged]
    await redis.delete(key)
    # a counter that is not an integer, any other key of another type
    counters = ("processed day", "processed", "failed day", "failed")
    await redis.set(key, "nan" if damaged in counters else "x")
    before = await dump_all(redis)
    with pytest.raises(BrokerError, match=r"WRONGTYPE|not an integer"):
        await ack_step(broker, step.message, "complete")
    assert await dump_all(redis) == before


async def test_a_signal_skips_waits_that_are_gone_or_unreadable(redis: Redis) -> None:
    # a run whose record expired, and a member no asyncq script wrote
    awaiting = keys.awaiting_key(Q, "go", "k")
    await redis.sadd(awaiting, "gone 0", "not-a-wait")
    assert await send_signal(redis, Q, "go", "k", payload=b"1", keep_ms=60_000, now=0) == 0
    assert not await redis.exists(keys.run_key(Q, "gone"))  # no record made up
    assert not await redis.exists(awaiting)
    assert await redis.get(keys.signal_key(Q, "go", "k")) == b"1"  # kept for a later wait


async def taken_step(broker: Broker, client: Client, retention: int = 0) -> TaskMessage:
    options: dict[str, Any] = {"retention": timedelta(seconds=retention)} if retention else {}
    headers = step_message(0).headers
    await client.enqueue(Task("step", b"{}"), task_id="r1-0", headers=headers, **options)
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    return got.message


@pytest.mark.parametrize("mode", ["done", "complete", "archive", "revoke"])
async def test_a_step_ack_is_asynqs_ack_plus_the_record(
    redis: Redis, client: Client, mode: StepAckMode
) -> None:
    broker = Broker(redis)
    clock = broker.clock()
    step = await taken_step(broker, client, retention=60 if mode == "complete" else 0)
    await redis.hset(keys.task_key(Q, "r1-0"), "result", "7")
    await redis.hset(keys.run_key(Q, "r1"), "s:0", "step")
    # an archived task past asynq's 90 days is trimmed by the archive, as asynq does
    await redis.zadd(keys.archived_key(Q), {"old": clock - ARCHIVED_EXPIRATION - 10})
    await redis.hset(keys.task_key(Q, "old"), "state", "archived")
    assert await ack_step(broker, step, mode, "ValueError: no") == "recorded"
    assert await redis.llen(keys.active_key(Q)) == 0
    assert await redis.zcard(keys.lease_key(Q)) == 0
    task = await redis.hgetall(keys.task_key(Q, "r1-0"))
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    processed = await redis.get(keys.processed_total_key(Q))
    failed = await redis.get(keys.failed_total_key(Q))
    assert processed == b"1" and failed == (b"1" if mode == "archive" else None)
    if mode in ("done", "revoke"):
        assert task == {}
    elif mode == "complete":
        assert task[b"state"] == b"completed"
        score = await redis.zscore(keys.completed_key(Q), "r1-0")
        assert score is not None and int(clock) + 60 - 1 <= score <= int(clock) + 61
        assert decode_task_message(task[b"msg"]).completed_at >= int(clock)
    else:
        assert task[b"state"] == b"archived"
        assert decode_task_message(task[b"msg"]).error_msg == "ValueError: no"
        assert await redis.zrange(keys.archived_key(Q), 0, -1) == [b"r1-0"]
        assert not await redis.exists(keys.task_key(Q, "old"))
    if mode in ("done", "complete"):
        assert record[b"r:0"] == b"7" and b"e:0" not in record
    else:
        assert record[b"e:0"] == b"ValueError: no" and b"r:0" not in record
    with pytest.raises(TaskNotFoundError):  # acknowledged already
        await ack_step(broker, step, mode)


async def test_a_step_ack_records_once_and_not_in_a_gone_run(redis: Redis, client: Client) -> None:
    broker = Broker(redis)
    step = await taken_step(broker, client)
    assert await ack_step(broker, step, "done") == "gone"  # no record: nothing made up
    assert not await redis.exists(keys.run_key(Q, "r1"))
    step = await taken_step(broker, client)
    await redis.hset(keys.run_key(Q, "r1"), mapping={"s:0": "step", "r:0": "1"})
    assert await ack_step(broker, step, "archive", "late") == "seen"
    assert await redis.hgetall(keys.run_key(Q, "r1")) == {b"s:0": b"step", b"r:0": b"1"}


async def test_a_suspension_of_a_run_not_active_changes_nothing(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    await redis.lrem(keys.active_key(Q), 0, "r1")  # recovered elsewhere meanwhile
    before = await dump_all(redis)
    with pytest.raises(TaskNotFoundError):
        await suspend_run(broker, run, SuspendPlan("sleep", until=10.0))
    assert await dump_all(redis) == before


async def test_a_parked_run_leaves_its_lease_and_its_pending_time(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    assert await suspend_run(broker, run, SuspendPlan("sleep", until=100.5)) == "parked"
    assert await redis.zcard(keys.lease_key(Q)) == 0
    assert await redis.zscore(keys.scheduled_key(Q), "r1") == 101  # rounded up, never early
    task = await redis.hgetall(keys.task_key(Q, "r1"))
    assert task[b"state"] == b"scheduled" and b"pending_since" not in task
    assert await redis.hget(keys.run_key(Q, "r1"), "until") == b"101"


async def test_a_new_suspension_replaces_what_the_last_one_waited_for(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    plan = SuspendPlan("steps", steps=[(0, step_message(0)), (1, step_message(1))], waits=[0, 1])
    assert await suspend_run(broker, run, plan) == "parked"
    # run by hand before its steps finished: it replays and now waits for a sleep
    await redis.zrem(keys.scheduled_key(Q), "r1")
    await redis.delete(keys.pending_key(Q))
    await redis.lpush(keys.pending_key(Q), "r1")
    got = await transitions.dequeue(broker, [Q])
    assert got is not None and got.message.id == "r1"
    assert await suspend_run(broker, got.message, SuspendPlan("sleep", until=50.0)) == "parked"
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    assert not {b"wait", b"missing", b"w:0", b"w:1"} & set(record)


@pytest.mark.parametrize("recorded", ["r", "e"])
async def test_a_suspension_on_an_outcome_already_recorded_is_ready(
    redis: Redis, client: Client, recorded: str
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    await redis.hset(
        keys.run_key(Q, "r1"), mapping={"s:0": "step", f"{recorded}:0": "x", "until": "5"}
    )
    plan = SuspendPlan("steps", steps=[(0, step_message(0))], waits=[0])
    assert await suspend_run(broker, run, plan) == "ready"
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1"]
    assert await redis.hget(keys.task_key(Q, "r1"), "state") == b"pending"
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    assert record[b"state"] == b"running" and b"until" not in record


async def test_a_signal_wait_takes_a_kept_signal_or_its_recorded_result(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    wait = SignalWait("go", "k", 0)
    await redis.set(keys.signal_key(Q, "go", "k"), b'{"x":1}')
    await redis.sadd(keys.awaiting_key(Q, "go", "k"), "r1 0")  # left by an earlier attempt
    plan = SuspendPlan("signal", signal=wait, until=10.0)
    assert await suspend_run(broker, run, plan) == "ready"
    assert await redis.hget(keys.run_key(Q, "r1"), "r:0") == b'{"x":1}'
    assert not await redis.exists(keys.signal_key(Q, "go", "k"))
    assert not await redis.exists(keys.awaiting_key(Q, "go", "k"))
    # replayed, it finds the wait recorded: ready again, nothing kept is taken
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    await redis.set(keys.signal_key(Q, "go", "k"), b"2")
    assert await suspend_run(broker, got.message, plan) == "ready"
    assert await redis.get(keys.signal_key(Q, "go", "k")) == b"2"
    assert await redis.hget(keys.run_key(Q, "r1"), "r:0") == b'{"x":1}'


async def test_a_signal_resumes_its_parked_run_and_wakes_the_queue(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    wait = SignalWait("go", "k", 0)
    plan = SuspendPlan("signal", records={"s:0": b"wait go k"}, signal=wait, until=4e9)
    assert await suspend_run(broker, run, plan) == "parked"
    record = keys.run_key(Q, "r1")
    assert await redis.hget(record, "until") is not None
    await redis.rpush(keys.pending_key(Q), "other")
    async with redis.pubsub() as sub:
        await sub.subscribe(keys.wakeup_channel(Q))
        await sub.get_message(timeout=5)  # the subscription's confirmation
        took = await send_signal(redis, Q, "go", "k", payload=b'"yes"', keep_ms=60_000, now=12.5)
        assert took == 1
        woke = await sub.get_message(ignore_subscribe_messages=True, timeout=5)
    assert woke is not None and woke["data"] == Q.encode()
    assert await redis.hget(record, "r:0") == b'"yes"'
    assert await redis.hget(record, "state") == b"running"
    assert await redis.hget(record, "until") is None
    assert await redis.hmget(keys.task_key(Q, "r1"), "state", "pending_since") == [
        b"pending",
        b"12500000000",
    ]
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1", b"other"]  # asynq's LPUSH
    assert await redis.zscore(keys.scheduled_key(Q), "r1") is None
    assert not await redis.exists(keys.signal_key(Q, "go", "k"))  # taken, not kept
    assert not await redis.exists(keys.awaiting_key(Q, "go", "k"))


async def test_a_signal_with_one_damaged_run_among_many_changes_nothing(redis: Redis) -> None:
    """The type check of every waiting run comes before the first write, wherever the
    damaged one is in the set."""
    awaiting = keys.awaiting_key(Q, "go", "k")
    for i in range(40):
        await redis.hset(keys.run_key(Q, f"g{i}"), "s:0", "wait go k")
        await redis.hset(keys.task_key(Q, f"g{i}"), "state", "scheduled")
        await redis.zadd(keys.scheduled_key(Q), {f"g{i}": FAR_FUTURE})
        await redis.sadd(awaiting, f"g{i} 0")
    await redis.set(keys.run_key(Q, "bad"), "x")
    await redis.sadd(awaiting, "bad 0")
    before = await dump_all(redis)
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await send_signal(redis, Q, "go", "k", payload=b"1", keep_ms=60_000, now=0)
    assert await dump_all(redis) == before


async def test_a_record_reads_the_same_on_redis_py_and_on_the_pipelined_connection(
    redis: Redis, redis_url: str
) -> None:
    # a worker's replay reads it on the broker's pipelined connection (a flat HGETALL
    # reply), the Inspector and tests on redis-py (a dict)
    opts = parse_redis_uri(redis_url)
    assert isinstance(opts, RedisClientOpts)
    fast = FastConnection.from_options(opts)
    try:
        assert await read_run(redis, Q, "r9") is None
        assert await read_run(fast, Q, "r9") is None
        await redis.hset(keys.run_key(Q, "r9"), mapping={"s:0": "step a", "r:0": b"\xff1"})
        want = {"s:0": b"step a", "r:0": b"\xff1"}
        assert await read_run(redis, Q, "r9") == want
        assert await read_run(fast, Q, "r9") == want
    finally:
        await fast.aclose()


async def acked_step(
    redis: Redis, client: Client, record: dict[str, str], *, index: int = 0
) -> tuple[Broker, TaskMessage]:
    """A step of run r1 taken by a worker, the run parked, its record *record*."""
    broker = Broker(redis)
    headers = step_message(index).headers
    await client.enqueue(Task("step", b"{}"), task_id=f"r1-{index}", headers=headers)
    step = await transitions.dequeue(broker, [Q])
    assert step is not None
    if record:
        await redis.hset(keys.run_key(Q, "r1"), mapping=record)
    await redis.hset(keys.task_key(Q, "r1"), mapping={"state": "scheduled"})
    await redis.zadd(keys.scheduled_key(Q), {"r1": FAR_FUTURE})
    return broker, step.message


async def test_a_step_whose_failure_is_recorded_is_seen_not_recorded_again(
    redis: Redis, client: Client
) -> None:
    broker, step = await acked_step(redis, client, {"e:0": "boom", "w:0": "1", "missing": "1"})
    assert await ack_step(broker, step, "complete") == "seen"
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    assert b"r:0" not in record and record[b"missing"] == b"1"
    assert await redis.zscore(keys.scheduled_key(Q), "r1") == FAR_FUTURE


async def test_a_step_the_run_does_not_wait_for_is_recorded_without_waking_it(
    redis: Redis, client: Client
) -> None:
    broker, step = await acked_step(redis, client, {"w:1": "1", "missing": "1", "wait": "1"})
    assert await ack_step(broker, step, "complete") == "recorded"
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    assert record[b"r:0"] == b"null" and record[b"missing"] == b"1" and b"w:1" in record
    assert await redis.zscore(keys.scheduled_key(Q), "r1") == FAR_FUTURE


async def test_the_first_of_two_waited_steps_counts_down_and_the_last_wakes_at_the_head(
    redis: Redis, client: Client
) -> None:
    record = {"w:0": "1", "w:1": "1", "missing": "2", "wait": "0,1"}
    broker, step = await acked_step(redis, client, record)
    assert await ack_step(broker, step, "complete") == "recorded"
    got = await redis.hgetall(keys.run_key(Q, "r1"))
    assert got[b"missing"] == b"1" and b"w:0" not in got and b"w:1" in got
    _, last = await acked_step(redis, client, {}, index=1)
    await client.enqueue(Task("other"), task_id="other")  # pending before the run wakes
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.wakeup_channel(Q))
    assert await pubsub.get_message(timeout=1) is not None  # the subscription
    assert await ack_step(broker, last, "complete") == "woken"
    assert await pubsub.get_message(timeout=1) == {
        "type": "message", "pattern": None,
        "channel": keys.wakeup_channel(Q).encode(), "data": Q.encode(),
    }  # fmt: skip
    await pubsub.aclose()
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1", b"other"]
    got = await redis.hgetall(keys.run_key(Q, "r1"))
    assert got[b"r:1"] == b"null" and got[b"state"] == b"running"
    assert not {b"w:1", b"missing", b"wait"} & set(got)


async def test_the_last_step_of_a_run_not_parked_is_recorded_for_its_replay(
    redis: Redis, client: Client
) -> None:
    broker, step = await acked_step(redis, client, {"w:0": "1", "missing": "1", "wait": "0"})
    await redis.zrem(keys.scheduled_key(Q), "r1")  # the run is running (or retrying)
    assert await ack_step(broker, step, "complete") == "recorded"
    got = await redis.hgetall(keys.run_key(Q, "r1"))
    assert got[b"r:0"] == b"null" and not {b"w:0", b"missing", b"wait"} & set(got)
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == []


async def test_a_waited_step_without_a_count_is_taken_as_the_last(
    redis: Redis, client: Client
) -> None:
    broker, step = await acked_step(redis, client, {"w:0": "1", "wait": "0"})
    assert await ack_step(broker, step, "complete") == "woken"


@pytest.mark.parametrize("complete", [True, False])
@pytest.mark.parametrize("damaged", ["step task", "run", "run task", "scheduled", "pending"])
async def test_a_batched_step_ack_on_a_damaged_key_changes_nothing(
    redis: Redis, client: Client, damaged: str, complete: bool
) -> None:
    broker, step = await acked_step(redis, client, {"w:0": "1", "missing": "1", "wait": "0"})
    key = {
        "step task": keys.task_key(Q, "r1-0"),
        "run": keys.run_key(Q, "r1"),
        "run task": keys.task_key(Q, "r1"),
        "scheduled": keys.scheduled_key(Q),
        "pending": keys.pending_key(Q),
    }[damaged]
    await redis.delete(key)
    await redis.set(key, "x")
    before = await dump_all(redis)
    [result] = await broker.ack_many([(step, complete)])
    assert isinstance(result, BrokerError) and "WRONGTYPE" in str(result)
    assert await dump_all(redis) == before


@pytest.mark.parametrize("complete", [True, False])
async def test_a_batch_checks_the_task_after_a_durable_step_too(
    redis: Redis, client: Client, complete: bool
) -> None:
    broker, step = await acked_step(redis, client, {"w:0": "1", "missing": "1", "wait": "0"})
    await client.enqueue(Task("plain"), task_id="p1")
    plain = await transitions.dequeue(broker, [Q])
    assert plain is not None and plain.message.id == "p1"
    await redis.delete(keys.task_key(Q, "p1"))
    await redis.set(keys.task_key(Q, "p1"), "x")
    before = await dump_all(redis)
    results = await broker.ack_many([(step, complete), (plain.message, True)])
    assert all(isinstance(r, BrokerError) and "WRONGTYPE" in str(r) for r in results)
    assert await dump_all(redis) == before


async def test_settling_writes_every_new_record_keeps_recorded_ones_and_sets_the_expiry(
    redis: Redis,
) -> None:
    record = keys.run_key(Q, "r1")
    await redis.hset(record, mapping={"s:0": "step a", "r:0": "1", "state": "running"})
    new = {"s:0": b"other", "r:0": b"2", "s:1": b"now", "r:1": b"3", "s:2": b"uuid", "r:2": b"4"}
    await settle_run(redis, Q, "r1", "succeeded", records=new, expire_in=0)
    assert await redis.hgetall(record) == {
        b"s:0": b"step a", b"r:0": b"1",  # recorded before: kept as they were
        b"s:1": b"now", b"r:1": b"3", b"s:2": b"uuid", b"r:2": b"4",
        b"state": b"succeeded",
    }  # fmt: skip
    assert await redis.pttl(record) == -1  # 0: kept, no expiry
    await settle_run(redis, Q, "r1", "failed", records={}, expire_in=1)
    assert await redis.hget(record, "state") == b"failed"
    assert 0 < await redis.pttl(record) <= 1000


def run_message(run_id: str = "r1") -> TaskMessage:
    return TaskMessage(type="run", payload=b"{}", id=run_id, queue=Q, retry=3, retention=60)


async def test_a_start_writes_the_run_task_and_its_pending_record_together(
    redis: Redis,
) -> None:
    broker = Broker(redis)
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.wakeup_channel(Q))
    assert await pubsub.get_message(timeout=1) is not None  # the subscription
    await redis.rpush(keys.pending_key(Q), "older")
    await start_run(broker, run_message())
    note = await pubsub.get_message(timeout=1)  # idle workers are told, queue or not empty
    assert note is not None and note["data"] == Q.encode()
    await pubsub.aclose()
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1", b"older"]
    task = await redis.hgetall(keys.task_key(Q, "r1"))
    assert decode_task_message(task[b"msg"]) == run_message()
    assert task[b"state"] == b"pending" and int(task[b"pending_since"]) > 0
    record = keys.run_key(Q, "r1")
    assert await redis.hgetall(record) == {b"state": b"pending"}
    assert PENDING_RUN_KEPT - 5 <= await redis.ttl(record) <= PENDING_RUN_KEPT
    assert await redis.smembers(keys.ALL_QUEUES) == {Q.encode()}


@pytest.mark.parametrize("existing", ["task", "record"])
async def test_a_start_refuses_an_id_in_use_writing_nothing(redis: Redis, existing: str) -> None:
    key = keys.task_key(Q, "r1") if existing == "task" else keys.run_key(Q, "r1")
    await redis.hset(key, "state", "waiting")
    before = await dump_all(redis)
    with pytest.raises(TaskIdConflictError):
        await start_run(Broker(redis), run_message())
    assert await dump_all(redis) == before


@pytest.mark.parametrize("damaged", ["pending", "queues"])
async def test_a_start_checks_its_keys_before_its_first_write(redis: Redis, damaged: str) -> None:
    await redis.set(keys.pending_key(Q) if damaged == "pending" else keys.ALL_QUEUES, "x")
    before = await dump_all(redis)
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await start_run(Broker(redis), run_message())
    assert await dump_all(redis) == before


async def test_the_first_suspension_of_a_started_run_keeps_its_record(
    redis: Redis,
) -> None:
    broker = Broker(redis)
    await start_run(broker, run_message())
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    plan = SuspendPlan("sleep", records={"s:0": b"sleep", "d:0": b"99"}, until=99.0)
    assert await suspend_run(broker, got.message, plan) == "parked"
    record = keys.run_key(Q, "r1")
    assert await redis.hget(record, "state") == b"waiting"
    assert await redis.ttl(record) == -1


async def test_a_retried_first_attempt_keeps_its_record(redis: Redis) -> None:
    await start_run(Broker(redis), run_message())
    record = keys.run_key(Q, "r1")
    await settle_run(redis, Q, "r1", "running", records={"s:0": b"now"}, expire_in=0)
    assert await redis.hgetall(record) == {b"state": b"running", b"s:0": b"now"}
    assert await redis.ttl(record) == -1


async def test_a_start_on_a_cluster_registers_its_queue_apart(redis: Redis) -> None:
    broker = Broker(redis)
    broker.on_cluster = True  # asynq:queues is in another slot: not one of the script's keys
    await start_run(broker, run_message())
    assert await redis.smembers(keys.ALL_QUEUES) == {Q.encode()}
    assert await redis.hgetall(keys.run_key(Q, "r1")) == {b"state": b"pending"}
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1"]


async def test_a_step_asked_for_twice_in_one_suspension_is_enqueued_once(
    redis: Redis, client: Client
) -> None:
    # run.gather(s, s): the same step twice in the plan
    broker = Broker(redis)
    run = await active_run(broker, client)
    twice = SuspendPlan("steps", steps=[(0, step_message(0)), (0, step_message(0))], waits=[0, 0])
    assert await suspend_run(broker, run, twice) == "parked"
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1-0"]
    assert await redis.hget(keys.run_key(Q, "r1"), "missing") == b"1"
    # so its one acknowledgement wakes the run (counted twice, the run would wait forever)
    step = await transitions.dequeue(broker, [Q])
    assert step is not None and step.message.id == "r1-0"
    assert await ack_step(broker, step.message, "done") == "woken"


async def test_a_suspension_of_a_run_cancelled_while_it_ran_writes_nothing(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    await redis.hset(keys.run_key(Q, "r1"), "state", "cancelled")  # as durable_cancel.lua
    plan = SuspendPlan("steps", records={"s:0": b"step a"}, steps=[(0, step_message(0))], waits=[0])
    before = await dump_all(redis)
    assert await suspend_run(broker, run, plan, step_here=10.0**10) == "cancelled"
    assert await dump_all(redis) == before
