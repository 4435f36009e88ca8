"""A run woken by its step's success continues on the worker that acknowledged the step,
in the step's slot (``ack_many.lua`` kinds h and H, ``record_step()``): active and leased
to that worker as a fetch leaves it, never in pending. A paused, limited or ordered
queue, a run task without its message, a damaged key or a worker that does not take the
run's queue leave the run to go to pending as before. No test here waits on the clock:
each runs scripts and reads Redis, or awaits a run's result."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import Client, Server, Task
from asyncq import _keys as keys
from asyncq._broker import Broker, DequeuedTask
from asyncq._broker.durable import (
    FAR_FUTURE,
    RUN_HEADER,
    RUN_QUEUE_HEADER,
    STEP_HEADER,
    SuspendPlan,
    suspend_run,
)
from asyncq.errors import BrokerError, TaskNotFoundError
from asyncq.proto.asynq import TaskMessage
from tests.support import durable_app as d
from tests.support import transitions
from tests.support.durable_scripts import active_run, step_message
from tests.support.helpers import dump_all

Q = "default"
WAITS_FOR_STEP_0 = {"w:0": "1", "missing": "1", "wait": "0", "state": "waiting"}


def everywhere(queue: str) -> bool:
    return True


def nowhere(queue: str) -> bool:
    return False


async def parked_run_and_step(redis: Redis, client: Client) -> tuple[Broker, TaskMessage]:
    """Run r1 parked, waiting for its step 0, which a worker has taken (active)."""
    broker = Broker(redis)
    await client.enqueue(Task("run", b"{}"), task_id="r1")
    run = await transitions.dequeue(broker, [Q])
    assert run is not None
    # parked as durable_suspend.lua leaves it: out of active and its lease, scheduled
    await redis.lrem(keys.active_key(Q), 0, "r1")
    await redis.zrem(keys.lease_key(Q), "r1")
    await redis.zadd(keys.scheduled_key(Q), {"r1": FAR_FUTURE})
    await redis.hset(keys.task_key(Q, "r1"), "state", "scheduled")
    await redis.hset(keys.run_key(Q, "r1"), mapping=WAITS_FOR_STEP_0)
    headers = {RUN_HEADER: "r1", RUN_QUEUE_HEADER: Q, STEP_HEADER: "0"}
    await client.enqueue(
        Task("step", b"{}"), task_id="r1-0", headers=headers, retention=timedelta(minutes=1)
    )
    step = await transitions.dequeue(broker, [Q])
    assert step is not None and step.message.id == "r1-0"
    await redis.hset(keys.task_key(Q, "r1-0"), "result", "42")
    return broker, step.message


@pytest.mark.parametrize("complete", [True, False])
async def test_a_woken_run_continues_here_leased_as_a_fetch_leaves_it(
    redis: Redis, client: Client, complete: bool
) -> None:
    broker, step = await parked_run_and_step(redis, client)
    await client.enqueue(Task("other"), task_id="other")
    assert await transitions.dequeue(broker, [Q]) is not None  # active before the run
    before = time.time()
    [result] = await broker.ack_many([(step, complete)], runs_here=everywhere)
    assert isinstance(result, DequeuedTask)
    assert result.message.id == "r1" and result.message.type == "run"
    assert before + broker.lease_duration - 1 <= result.lease_expiry
    assert result.lease_expiry <= time.time() + broker.lease_duration
    # the run: active (at the head, where a fetch's RPOPLPUSH puts it), leased until the
    # expiry the worker was given, never pending
    assert await redis.lrange(keys.active_key(Q), 0, -1) == [b"r1", b"other"]
    assert await redis.zscore(keys.lease_key(Q), "r1") == int(result.lease_expiry)
    assert await redis.zscore(keys.scheduled_key(Q), "r1") is None
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == []
    run_task = await redis.hgetall(keys.task_key(Q, "r1"))
    assert run_task[b"state"] == b"active" and b"pending_since" not in run_task
    # the step: acknowledged and recorded in the run, as without continuing
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    assert record[b"r:0"] == b"42" and record[b"state"] == b"running"
    assert b"wait" not in record and b"missing" not in record and b"w:0" not in record
    assert await redis.lpos(keys.active_key(Q), "r1-0") is None
    assert await redis.zscore(keys.lease_key(Q), "r1-0") is None
    assert await redis.exists(keys.task_key(Q, "r1-0")) == (1 if complete else 0)
    assert await redis.get(keys.processed_total_key(Q)) == b"1"
    # acknowledged again: not active any more, and the run is not taken twice
    [again] = await broker.ack_many([(step, complete)], runs_here=everywhere)
    assert isinstance(again, TaskNotFoundError)


async def test_a_worker_that_does_not_take_the_runs_queue_sends_it_to_pending(
    redis: Redis, client: Client
) -> None:
    broker, step = await parked_run_and_step(redis, client)
    asked: list[str] = []

    def not_here(queue: str) -> bool:
        asked.append(queue)
        return False

    assert await broker.ack_many([(step, True)], runs_here=not_here) == [None]
    assert asked == [Q]
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1"]
    assert await redis.lrange(keys.active_key(Q), 0, -1) == []
    assert await redis.hget(keys.task_key(Q, "r1"), "state") == b"pending"


@pytest.mark.parametrize("flag", ["paused", "asyncq:limit", "asyncq:ordered"])
async def test_a_paused_limited_or_ordered_queue_gives_the_run_only_to_a_fetch(
    redis: Redis, client: Client, flag: str
) -> None:
    broker, step = await parked_run_and_step(redis, client)
    await redis.set(keys.queue_key_prefix(Q) + flag, "1")
    assert await broker.ack_many([(step, True)], runs_here=everywhere) == [None]
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1"]
    assert await redis.lpos(keys.active_key(Q), "r1") is None
    assert await redis.zscore(keys.lease_key(Q), "r1") is None
    assert await redis.hget(keys.run_key(Q, "r1"), "r:0") == b"42"


async def test_a_run_task_without_its_message_goes_to_pending(redis: Redis, client: Client) -> None:
    broker, step = await parked_run_and_step(redis, client)
    await redis.hdel(keys.task_key(Q, "r1"), "msg")
    assert await broker.ack_many([(step, True)], runs_here=everywhere) == [None]
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1"]
    assert await redis.lpos(keys.active_key(Q), "r1") is None


async def test_a_run_whose_message_is_unusable_here_is_archived_as_a_fetch_would(
    redis: Redis, client: Client
) -> None:
    broker, step = await parked_run_and_step(redis, client)
    await redis.hset(keys.task_key(Q, "r1"), "msg", b"\xff not a task message")
    assert await broker.ack_many([(step, True)], runs_here=everywhere) == [None]
    assert await redis.zscore(keys.archived_key(Q), "r1") is not None
    assert await redis.lpos(keys.active_key(Q), "r1") is None
    assert await redis.zscore(keys.lease_key(Q), "r1") is None
    assert await redis.hget(keys.run_key(Q, "r1"), "r:0") == b"42"


@pytest.mark.parametrize("damaged", ["active", "lease"])
async def test_a_continuing_ack_on_a_damaged_key_of_the_runs_queue_changes_nothing(
    redis: Redis, client: Client, damaged: str
) -> None:
    # The run continues in another queue than its step's, so that the damaged key is
    # only the run's (the step's own active list and lease are checked anyway).
    broker = Broker(redis)
    await client.enqueue(Task("run", b"{}"), task_id="r1", queue="runs")
    await redis.delete(keys.pending_key("runs"))
    await redis.zadd(keys.scheduled_key("runs"), {"r1": FAR_FUTURE})
    await redis.hset(keys.task_key("runs", "r1"), "state", "scheduled")
    await redis.hset(keys.run_key("runs", "r1"), mapping=WAITS_FOR_STEP_0)
    headers = {RUN_HEADER: "r1", RUN_QUEUE_HEADER: "runs", STEP_HEADER: "0"}
    await client.enqueue(Task("step", b"{}"), task_id="r1-0", headers=headers)
    step = await transitions.dequeue(broker, [Q])
    assert step is not None
    key = (keys.active_key if damaged == "active" else keys.lease_key)("runs")
    await redis.set(key, "x")
    before = await dump_all(redis)
    [result] = await broker.ack_many([(step.message, False)], runs_here=everywhere)
    assert isinstance(result, BrokerError) and "WRONGTYPE" in str(result)
    assert await dump_all(redis) == before
    # not continuing here, the run's active list and lease are not touched: acknowledged
    [result] = await broker.ack_many([(step.message, False)], runs_here=nowhere)
    assert result is None
    assert await redis.lrange(keys.pending_key("runs"), 0, -1) == [b"r1"]


async def test_runs_on_one_worker_continue_in_their_steps_slots(
    redis: Redis, worker: Server
) -> None:
    handle = await d.counted.start(4, False)  # its steps in another queue: never inline
    assert await handle.result(timeout=20) == 7
    # each of the three steps ran in the slot its run left, and each step's success woke
    # the run, which continued in the step's slot: nothing of the run was fetched after
    # its first attempt
    assert worker.stats.continued == 6
    assert worker.stats.inline == 0


# -- a step in the slot its run leaves (durable_suspend.lua's optional lease) -------------


async def test_a_suspension_leases_its_first_step_to_the_caller(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    await client.enqueue(Task("other"), task_id="other")
    assert await transitions.dequeue(broker, [Q]) is not None  # active before the step
    plan = SuspendPlan("steps", steps=[(0, step_message(0)), (1, step_message(1))], waits=[0, 1])
    expiry = time.time() + 30
    assert await suspend_run(broker, run, plan, step_here=expiry) == "here"
    # the first step: active at the head (where a fetch puts it) and leased to us
    assert await redis.lrange(keys.active_key(Q), 0, -1) == [b"r1-0", b"other"]
    assert await redis.zscore(keys.lease_key(Q), "r1-0") == int(expiry)
    step = await redis.hgetall(keys.task_key(Q, "r1-0"))
    assert step[b"state"] == b"active" and b"pending_since" not in step
    # the second one pending for any worker; the run parked, waiting for both
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1-1"]
    assert await redis.hget(keys.task_key(Q, "r1-1"), "state") == b"pending"
    assert await redis.zscore(keys.scheduled_key(Q), "r1") == FAR_FUTURE
    assert await redis.hget(keys.run_key(Q, "r1"), "missing") == b"2"


@pytest.mark.parametrize("flag", ["paused", "asyncq:limit", "asyncq:ordered"])
async def test_a_paused_limited_or_ordered_queue_gets_its_step_pending(
    redis: Redis, client: Client, flag: str
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    await redis.set(keys.queue_key_prefix(Q) + flag, "1")
    plan = SuspendPlan("steps", steps=[(0, step_message(0))], waits=[0])
    assert await suspend_run(broker, run, plan, step_here=time.time() + 30) == "parked"
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1-0"]
    assert await redis.zscore(keys.lease_key(Q), "r1-0") is None


async def test_a_step_enqueued_by_an_earlier_attempt_is_not_leased_again(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    await client.enqueue(Task("step"), task_id="r1-0")  # as a crashed attempt left it
    plan = SuspendPlan("steps", steps=[(0, step_message(0))], waits=[0])
    assert await suspend_run(broker, run, plan, step_here=time.time() + 30) == "parked"
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1-0"]
    assert await redis.zscore(keys.lease_key(Q), "r1-0") is None


@pytest.mark.parametrize("damaged", ["active", "lease"])
async def test_a_leasing_suspension_on_a_damaged_key_of_the_steps_queue_changes_nothing(
    redis: Redis, client: Client, damaged: str
) -> None:
    broker = Broker(redis)
    run = await active_run(broker, client)
    key = (keys.active_key if damaged == "active" else keys.lease_key)("steps")
    await redis.set(key, "x")
    plan = SuspendPlan("steps", steps=[(0, step_message(0, "steps"))], waits=[0])
    before = await dump_all(redis)
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await suspend_run(broker, run, plan, step_here=time.time() + 30)
    assert await dump_all(redis) == before
    # without the lease, the step's queue's active list and lease are not touched
    assert await suspend_run(broker, run, plan) == "parked"
    assert await redis.lrange(keys.pending_key("steps"), 0, -1) == [b"r1-0"]


async def test_a_step_in_another_busy_queue_is_leased_beside_its_tasks(
    redis: Redis, client: Client
) -> None:
    # the step's queue's active list and lease hold another task: checked, and kept
    broker = Broker(redis)
    run = await active_run(broker, client)
    await client.enqueue(Task("other"), task_id="other", queue="steps")
    assert await transitions.dequeue(broker, ["steps"]) is not None
    plan = SuspendPlan("steps", steps=[(0, step_message(0, "steps"))], waits=[0])
    expiry = time.time() + 30
    assert await suspend_run(broker, run, plan, step_here=expiry) == "here"
    assert await redis.lrange(keys.active_key("steps"), 0, -1) == [b"r1-0", b"other"]
    assert await redis.zscore(keys.lease_key("steps"), "r1-0") == int(expiry)
    assert await redis.zscore(keys.lease_key("steps"), "other") is not None
