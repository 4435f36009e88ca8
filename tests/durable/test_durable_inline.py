"""A step a run's attempt awaits alone, in the run's queue, runs inline: in the slot of the
attempt, which goes on with the result its acknowledgement recorded, the run task staying
active and leased (``durable_inline.lua``; ``ack_many.lua`` kinds i and I;
``Attempts.run_inline``). Anything else leaves the attempt to suspend as before. The
scripts are driven without a worker first; then workers run, stop and cancel runs whose
steps are inline. No test here waits on the clock: each waits on what Redis holds or on a
run's result."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import Client, Inspector, Server, Task, TaskState
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.durable import PENDING_RUN_KEPT, Recorded, SuspendPlan, start_inline
from asyncq.errors import BrokerError
from asyncq.proto.asynq import TaskMessage
from tests.support import durable_app as d
from tests.support import transitions
from tests.support.durable_scripts import active_run, step_message
from tests.support.helpers import dump_all, wait_until

# gated() waits until a test opens the gate (tests/durable/conftest.py)
pytestmark = pytest.mark.usefixtures("gate")

Q = "default"


def one_step(index: int = 0, **records: bytes) -> SuspendPlan:
    return SuspendPlan(
        "steps", records=records, steps=[(index, step_message(index))], waits=[index]
    )


async def start_one(broker: Broker, plan: SuspendPlan, expiry: float) -> str:
    """Run r1's inline step, alone in its call."""
    (answer,) = await start_inline(broker, Q, [("r1", plan)], expiry)
    return answer


# -- durable_inline.lua --------------------------------------------------------------------


async def test_an_inline_step_is_leased_to_the_caller_and_the_run_stays_active(
    redis: Redis, client: Client
) -> None:
    broker = Broker(redis)
    await active_run(broker, client)
    await redis.hset(keys.run_key(Q, "r1"), "state", "pending")  # as durable_start left it
    await redis.expire(keys.run_key(Q, "r1"), PENDING_RUN_KEPT)
    run_lease = await redis.zscore(keys.lease_key(Q), "r1")
    expiry = time.time() + 30
    assert await start_one(broker, one_step(0, **{"s:0": b"step x {}"}), expiry) == "here"
    # the step: active at the head (where a fetch puts it), leased to us, its message stored
    assert await redis.lrange(keys.active_key(Q), 0, -1) == [b"r1-0", b"r1"]
    assert await redis.zscore(keys.lease_key(Q), "r1-0") == int(expiry)
    step = await redis.hgetall(keys.task_key(Q, "r1-0"))
    assert step[b"state"] == b"active" and b"pending_since" not in step
    # the run: untouched (active, its lease as it was), its record running, kept for good
    assert await redis.zscore(keys.lease_key(Q), "r1") == run_lease
    assert await redis.hget(keys.task_key(Q, "r1"), "state") == b"active"
    assert await redis.zscore(keys.scheduled_key(Q), "r1") is None
    assert await redis.hgetall(keys.run_key(Q, "r1")) == {
        b"state": b"running",
        b"s:0": b"step x {}",
    }
    assert await redis.ttl(keys.run_key(Q, "r1")) == -1


@pytest.mark.parametrize(
    ("setup", "answer"),
    [
        ({"run": {"r:0": "3"}}, "seen"),
        ({"run": {"e:0": "boom"}}, "seen"),
        ({"run": {"state": "cancelled"}}, "cancelled"),
        ({"run": {"state": "waiting", "w:0": "1"}}, "waiting"),
        ({"step": {"msg": "x", "state": "retry"}}, "there"),
        ({"flag": "paused"}, "fetch"),
        ({"flag": "asyncq:limit"}, "fetch"),
        ({"flag": "asyncq:ordered"}, "fetch"),
    ],
)
async def test_an_inline_step_not_taken_writes_nothing_and_says_why(
    redis: Redis, client: Client, setup: dict[str, object], answer: str
) -> None:
    broker = Broker(redis)
    await active_run(broker, client)
    if "run" in setup:
        await redis.hset(keys.run_key(Q, "r1"), mapping=setup["run"])  # type: ignore[arg-type]
    if "step" in setup:
        await redis.hset(keys.task_key(Q, "r1-0"), mapping=setup["step"])  # type: ignore[arg-type]
    if "flag" in setup:
        await redis.set(keys.queue_key_prefix(Q) + str(setup["flag"]), "1")
    before = await dump_all(redis)
    plan = one_step(0, **{"s:0": b"step x {}"})
    assert await start_one(broker, plan, time.time() + 30) == answer
    assert await dump_all(redis) == before


@pytest.mark.parametrize("damaged", ["active", "lease"])
async def test_inline_steps_on_a_damaged_key_of_their_queue_change_nothing(
    redis: Redis, client: Client, damaged: str
) -> None:
    broker = Broker(redis)
    await active_run(broker, client)
    key = {"active": keys.active_key(Q), "lease": keys.lease_key(Q)}[damaged]
    await redis.delete(key)
    await redis.set(key, "x")
    before = await dump_all(redis)
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await start_one(broker, one_step(), time.time() + 30)
    assert await dump_all(redis) == before


async def test_a_damaged_record_fails_its_own_step_only(redis: Redis, client: Client) -> None:
    broker = Broker(redis)
    await active_run(broker, client)
    await client.enqueue(Task("run"), task_id="r2")
    assert await transitions.dequeue(broker, [Q]) is not None
    await redis.set(keys.run_key(Q, "r1"), "x")
    r2_step = TaskMessage(type="step", id="r2-0", queue=Q)
    plans = [
        ("r1", one_step()),
        ("r2", SuspendPlan("steps", steps=[(0, r2_step)], waits=[0])),
    ]
    answers = await start_inline(broker, Q, plans, time.time() + 30)
    assert answers[0].startswith("WRONGTYPE") and answers[1] == "here"
    assert await redis.exists(keys.task_key(Q, "r1-0")) == 0  # nothing of r1's written
    assert await redis.get(keys.run_key(Q, "r1")) == b"x"
    assert await redis.lrange(keys.active_key(Q), 0, -1) == [b"r2-0", b"r2", b"r1"]


async def test_an_inline_step_in_another_queue_is_refused(redis: Redis, client: Client) -> None:
    broker = Broker(redis)
    await active_run(broker, client)
    plan = SuspendPlan("steps", steps=[(0, step_message(0, "other"))], waits=[0])
    with pytest.raises(ValueError, match="not in its run's queue"):
        await start_one(broker, plan, time.time() + 30)


# -- its acknowledgement (ack_many.lua kinds i and I) ----------------------------------------


async def leased_inline(redis: Redis, client: Client) -> tuple[Broker, TaskMessage]:
    broker = Broker(redis)
    await active_run(broker, client)
    assert await start_one(broker, one_step(), time.time() + 30) == "here"
    return broker, step_message(0)


@pytest.mark.parametrize("complete", [False, True])
async def test_an_inline_steps_ack_answers_with_what_it_recorded(
    redis: Redis, client: Client, complete: bool
) -> None:
    broker, step = await leased_inline(redis, client)
    # the result its handler wrote comes with it (not written to its task hash before)
    got = await broker.ack_many([(step, complete)], inline={"r1-0": b"42"})
    assert got == [Recorded(b"42")]
    assert await redis.hget(keys.run_key(Q, "r1"), "r:0") == b"42"
    task = await redis.hgetall(keys.task_key(Q, "r1-0"))
    if complete:  # kept for its retention, with its result, as any completed task
        assert task[b"state"] == b"completed" and task[b"result"] == b"42"
    else:
        assert task == {}
    assert await redis.lrange(keys.active_key(Q), 0, -1) == [b"r1"]  # the run goes on
    assert await redis.get(keys.processed_total_key(Q)) == b"1"


@pytest.mark.parametrize("complete", [False, True])
async def test_an_inline_step_that_wrote_no_result_records_null(
    redis: Redis, client: Client, complete: bool
) -> None:
    broker, step = await leased_inline(redis, client)
    assert await broker.ack_many([(step, complete)], inline={"r1-0": None}) == [Recorded(b"null")]
    assert await redis.hget(keys.run_key(Q, "r1"), "r:0") == b"null"
    assert await redis.hexists(keys.task_key(Q, "r1-0"), "result") == 0


async def test_a_batch_mixes_inline_steps_with_other_tasks_of_the_queue(
    redis: Redis, client: Client
) -> None:
    broker, step = await leased_inline(redis, client)
    await client.enqueue(Task("plain"), task_id="p1")
    got = await transitions.dequeue(broker, [Q])
    assert got is not None and got.message.id == "p1"
    acked = await broker.ack_many([(got.message, False), (step, True)], inline={"r1-0": b""})
    assert acked == [None, Recorded(b"")]  # an empty result is a result
    assert await redis.exists(keys.task_key(Q, "p1")) == 0
    assert await redis.hget(keys.task_key(Q, "r1-0"), "result") == b""


@pytest.mark.parametrize("complete", [False, True])
async def test_a_batch_checks_the_task_after_an_inline_step_too(
    redis: Redis, client: Client, complete: bool
) -> None:
    broker, step = await leased_inline(redis, client)
    await client.enqueue(Task("plain"), task_id="p1", retention=timedelta(minutes=1))
    got = await transitions.dequeue(broker, [Q])
    assert got is not None and got.message.id == "p1"
    await redis.delete(keys.task_key(Q, "p1"))
    await redis.set(keys.task_key(Q, "p1"), "x")  # the task after the step: damaged
    before = await dump_all(redis)
    acked = await broker.ack_many([(step, complete), (got.message, True)], inline={"r1-0": b"42"})
    assert all(isinstance(a, BrokerError) and "WRONGTYPE" in str(a) for a in acked)
    assert await dump_all(redis) == before


async def test_an_inline_steps_ack_after_its_outcome_was_recorded_answers_none(
    redis: Redis, client: Client
) -> None:
    broker, step = await leased_inline(redis, client)
    await redis.hset(keys.run_key(Q, "r1"), "r:0", "7")  # recorded by another attempt
    assert await broker.ack_many([(step, False)], inline={"r1-0": b"42"}) == [None]
    assert await redis.hget(keys.run_key(Q, "r1"), "r:0") == b"7"  # not recorded again
    assert await redis.exists(keys.task_key(Q, "r1-0")) == 0  # acknowledged all the same
    assert await redis.get(keys.processed_total_key(Q)) == b"1"


async def test_an_inline_steps_ack_on_a_gone_record_answers_none_and_writes_none(
    redis: Redis, client: Client
) -> None:
    broker, step = await leased_inline(redis, client)
    await redis.delete(keys.run_key(Q, "r1"))  # expired after the run ended elsewhere
    assert await broker.ack_many([(step, False)], inline={"r1-0": b"42"}) == [None]
    assert await redis.exists(keys.run_key(Q, "r1")) == 0  # not written again
    assert await redis.exists(keys.task_key(Q, "r1-0")) == 0  # acknowledged all the same


async def test_an_inline_steps_ack_wakes_an_attempt_parked_on_it_and_answers_none(
    redis: Redis, client: Client
) -> None:
    broker, step = await leased_inline(redis, client)
    # the run's lease was lost and another attempt parked on the step meanwhile
    await redis.lrem(keys.active_key(Q), 0, "r1")
    await redis.zrem(keys.lease_key(Q), "r1")
    await redis.zadd(keys.scheduled_key(Q), {"r1": 253402300799})
    await redis.hset(keys.task_key(Q, "r1"), "state", "scheduled")
    await redis.hset(keys.run_key(Q, "r1"), mapping={"w:0": "1", "missing": "1", "wait": "0"})
    assert await broker.ack_many([(step, False)], inline={"r1-0": b"42"}) == [None]
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"r1"]
    assert await redis.hget(keys.run_key(Q, "r1"), "r:0") == b"42"


async def test_an_inline_steps_ack_on_a_damaged_record_changes_nothing(
    redis: Redis, client: Client
) -> None:
    broker, step = await leased_inline(redis, client)
    await redis.delete(keys.run_key(Q, "r1"))
    await redis.set(keys.run_key(Q, "r1"), "x")
    before = await dump_all(redis)
    (got,) = await broker.ack_many([(step, False)], inline={"r1-0": b"42"})
    assert isinstance(got, BrokerError) and "WRONGTYPE" in str(got)
    assert await dump_all(redis) == before


# -- on a worker -----------------------------------------------------------------------------


@pytest.fixture
async def insp(redis: Redis) -> AsyncIterator[Inspector]:
    async with Inspector(redis) as inspector:
        yield inspector


async def test_a_runs_steps_run_inline_and_the_attempt_goes_on(
    redis: Redis, worker: Server
) -> None:
    handle = await d.chain3.start(4)
    assert await handle.result(timeout=20) == 55
    # every step in the attempt's slot, with the result it recorded: the run was fetched
    # once, never suspended, never continued after a step
    assert worker.stats.inline == 3
    assert worker.stats.continued == 0
    record = await redis.hgetall(keys.run_key(d.QUEUE, handle.id))
    assert record[b"state"] == b"succeeded"
    assert [record[f"r:{i}".encode()] for i in range(3)] == [b"5", b"50", b"55"]
    assert b"wait" not in record and b"until" not in record


async def test_while_an_inline_step_runs_its_run_is_active_and_leased(
    redis: Redis, insp: Inspector, worker: Server
) -> None:
    handle = await d.gate_inline.start(1)
    await wait_until(
        lambda: redis.exists(keys.task_key(d.QUEUE, f"{handle.id}-0")), what="the step"
    )
    assert await redis.hget(keys.task_key(d.QUEUE, f"{handle.id}-0"), "state") == b"active"
    assert await redis.hget(keys.task_key(d.QUEUE, handle.id), "state") == b"active"
    assert await redis.zscore(keys.lease_key(d.QUEUE), handle.id) is not None
    assert await redis.zscore(keys.scheduled_key(d.QUEUE), handle.id) is None
    assert await redis.hget(keys.run_key(d.QUEUE, handle.id), "state") == b"running"
    # as the Inspector, the CLI and the web page show it: running, its step under way
    info = await insp.get_durable_run(d.QUEUE, handle.id)
    assert info.state == "running" and info.waiting_for is None
    (entry,) = info.entries
    assert entry.step_id == f"{handle.id}-0" and entry.result is None and entry.error is None
    assert (await insp.get_task(d.QUEUE, entry.step_id)).state is TaskState.ACTIVE
    d.gate["open"].set()
    assert await handle.result(timeout=20) == 101
    assert worker.stats.inline == 1


async def test_an_inline_step_outlives_a_cancelled_attempt_in_its_slot_and_is_recorded(
    redis: Redis, insp: Inspector, worker: Server
) -> None:
    handle = await d.gate_inline.start(1)
    step = keys.task_key(d.QUEUE, f"{handle.id}-0")
    await wait_until(lambda: redis.exists(step), what="the inline step")
    assert await insp.cancel_durable_run(d.QUEUE, handle.id) == "running"

    async def cancelled() -> bool:
        return (await insp.get_durable_run(d.QUEUE, handle.id)).state == "cancelled"

    await wait_until(cancelled, what="the stopped attempt archived")
    assert (await insp.get_task(d.QUEUE, handle.id)).state is TaskState.ARCHIVED
    # the attempt ended; its step runs on, in its slot, which is not free until it ends
    processor = worker.processor
    assert processor.slots.free == processor.slots.capacity - 1
    d.gate["open"].set()
    await wait_until(
        lambda: redis.hexists(keys.run_key(d.QUEUE, handle.id), "r:0"), what="step recorded"
    )
    assert await redis.hget(keys.run_key(d.QUEUE, handle.id), "r:0") == b"101"
    await wait_until(
        lambda: processor.slots.free == processor.slots.capacity, what="the slot freed"
    )


async def test_a_worker_stopping_requeues_a_run_and_its_inline_step_and_the_run_ends_later(
    redis: Redis, app: None
) -> None:
    worker = await d.start_worker()
    handle = await d.gate_inline.start(1)
    step_key = keys.task_key(d.QUEUE, f"{handle.id}-0")
    try:
        await wait_until(lambda: redis.exists(step_key), what="the inline step")
    finally:
        await worker.shutdown()  # the gate holds the step past the grace: both requeued
    pending = await redis.lrange(keys.pending_key(d.QUEUE), 0, -1)
    assert sorted(pending) == sorted([handle.id.encode(), f"{handle.id}-0".encode()])
    d.gate["open"].set()
    worker = await d.start_worker()
    try:
        assert await handle.result(timeout=20) == 101
    finally:
        await worker.shutdown()


async def test_an_attempt_does_not_spend_its_timeout_on_an_inline_step(
    redis: Redis, worker: Server
) -> None:
    handle = await d.brief.start()  # 1 s per attempt; its inline step takes 1.5 s
    assert await handle.result(timeout=20) == 7
    assert worker.stats.inline == 1
    assert worker.stats.failed == 0  # no attempt ended on its deadline


async def test_the_run_task_s_deadline_moves_with_its_attempt_s(
    redis: Redis, worker: Server
) -> None:
    """After an inline step the handler's ``task.deadline`` is the attempt's: moved on by
    what the step took, not the one it started with (which has passed by then)."""
    handle = await d.brief_deadline.start()  # 1 s per attempt; its inline step takes 1.5 s
    before, after, step_ended = await handle.result(timeout=20)
    assert worker.stats.inline == 1
    assert after - before >= 1.5  # the step's own time, at least
    assert before < step_ended < after  # the first had passed, the moved one had not
