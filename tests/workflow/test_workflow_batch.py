"""Workflow steps acknowledged in the batches of plain successes (ack_many.lua).

A step's success shares the one ``ack_many`` script call of its batch with plain
tasks; the same call records it in its workflow and hands off to the next stage.
Exact counts: what one call does, what a chord costs in Redis commands (INFO
commandstats, so the commands inside scripts count), and that a worker killed
mid-batch neither loses a step nor counts one twice.
"""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import Client, ServeMux, Server, Task, chain, chord, group_results
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.workflow import ack_step, cancel_workflow, read_workflow, workflow_key
from asyncq.errors import TaskNotFoundError
from tests.support import transitions
from tests.support.helpers import FakeClock, dump_all
from tests.support.procs import FAST, spawn, stop_process, wait_for_line, wait_until
from tests.support.workers.workflow_worker import CALLBACKS, STARTS

Q = "default"


async def command_calls(redis: Redis) -> dict[str, int]:
    """Calls per command since the server started, the commands run by scripts included;
    without the failed ones (an EVALSHA answered NOSCRIPT runs nothing, and is retried)."""
    stats: dict[str, Any] = await redis.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"]) - int(v.get("failed_calls", 0))
        for name, v in stats.items()
    }


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    out = {name: n - before.get(name, 0) for name, n in after.items()}
    out["info"] -= 1  # the INFO reading *after*
    return {name: n for name, n in out.items() if n}


async def test_one_ack_call_acknowledges_steps_and_plain_tasks_and_hands_off(
    redis: Redis, client: Client, broker: Broker
) -> None:
    n = 40
    info = await chord([Task("m") for _ in range(n)], Task("cb")).enqueue(client)
    await client.enqueue(Task("plain"))
    kept = await client.enqueue(Task("kept", retention=timedelta(minutes=1)))
    got = await transitions.dequeue_many(broker, [Q], n + 2)
    assert len(got) == n + 2
    for d in got:
        place = d.message.headers.get("asyncq-workflow-step", "")
        if place and int(place.split(".")[1]) % 2 == 0:  # half the members wrote a result
            await broker.write_result(Q, d.message.id, f"r{place}".encode())
    items = [(d.message, d.message.id == kept.id) for d in got]
    await broker.ack_many([])  # nothing to write: no call
    await broker.ack_many([(got[0].message, False)])  # the script loaded, the first step done
    items = items[1:]
    before = await command_calls(redis)
    assert await broker.ack_many(items) == [None] * len(items)
    used = delta(before, await command_calls(redis))
    assert used["evalsha"] == 1  # every step and both plain tasks: one script call
    assert used.get("hincrby") == 1  # the stage's counter: once for its 40 members
    # the batch's members' states at once, then the hand-off: the stage's results, the callback
    assert used["hmget"] == 3
    wf = await read_workflow(redis, Q, info.id)
    assert wf is not None and wf.state == "running" and wf.stage == 1
    assert [s.state for s in wf.stages[0]] == ["succeeded"] * n
    for j, step in enumerate(wf.stages[0]):
        assert step.result == (f"r0.{j}".encode() if j % 2 == 0 else None)
    assert [s.state for s in wf.stages[1]] == ["pending"]
    # the callback, enqueued by the same call, gets the group's results in member order
    (cb_id,) = await redis.lrange(keys.pending_key(Q), 0, -1)
    callback = await transitions.dequeue(broker, [Q])
    assert callback is not None and callback.message.id == cb_id.decode()
    results = group_results(callback.message.payload)
    assert results == [f"r0.{j}".encode() if j % 2 == 0 else b"" for j in range(n)]
    assert await redis.get(keys.processed_total_key(Q)) == str(n + 2).encode()
    assert await redis.zscore(keys.completed_key(Q), kept.id) is not None

    # The same batch again (a reply lost, the write repeated): nothing is counted twice.
    again = await broker.ack_many(items)
    assert all(isinstance(r, TaskNotFoundError) for r in again)
    assert await redis.hget(workflow_key(Q, info.id), "left:0") == b"0"
    assert await redis.llen(keys.pending_key(Q)) == 0  # no second callback
    assert await redis.get(keys.processed_total_key(Q)) == str(n + 2).encode()


async def test_steps_of_two_workflows_and_a_completed_step_in_one_batch(
    redis: Redis, client: Client, broker: Broker
) -> None:
    other = "other"
    a = await chord([Task("a") for _ in range(3)], Task("cb")).enqueue(client)
    # b's members (and its hash) in another queue: the batch spans two queues,
    # still one script call (ack_queues.lua)
    b = await chord(
        [Task("b", queue=other, retention=timedelta(minutes=1)) for _ in range(2)], Task("cb")
    ).enqueue(client)
    got = await transitions.dequeue_many(broker, [Q, other], 5)
    # one of a's members stays out: a's stage is not finished by this batch
    out = next(d.message for d in got if d.message.type == "a")
    items = [(d.message, d.message.type == "b") for d in got if d.message is not out]
    before = await command_calls(redis)
    assert await broker.ack_many(items) == [None] * 4
    assert delta(before, await command_calls(redis))["evalsha"] == 1
    wa = await read_workflow(redis, Q, a.id)
    wb = await read_workflow(redis, other, b.id)
    assert wa is not None and wb is not None
    assert (wa.stage, sorted(s.state for s in wa.stages[0])) == (0, ["pending"] + ["succeeded"] * 2)
    assert (wb.stage, [s.state for s in wb.stages[0]]) == (1, ["succeeded"] * 2)
    for step in wb.stages[0]:  # completed (kept for the retention), not deleted
        assert await redis.hget(keys.task_key(other, step.id), "state") == b"completed"
        kept_until = await redis.zscore(keys.completed_key(other), step.id)
        assert kept_until is not None and kept_until > time.time() + 30  # now + 1 minute
    assert await redis.llen(keys.pending_key(Q)) == 1  # b's callback only
    assert await broker.ack_many([(out, False)]) == [None]
    wa = await read_workflow(redis, Q, a.id)
    assert wa is not None and wa.stage == 1
    assert await redis.llen(keys.pending_key(Q)) == 2


@pytest.mark.timeout(120)
async def test_a_chord_costs_at_most_15_commands_per_member(redis: Redis, client: Client) -> None:
    n = 500
    ran = asyncio.Event()
    mux = ServeMux()

    async def member(task: Task) -> None:
        return None

    async def callback(task: Task) -> None:
        ran.set()

    mux.handle("m", member)
    mux.handle("cb", callback)
    server = Server(redis, concurrency=100, **FAST)
    await server.start(mux)
    try:
        before = await command_calls(redis)
        await chord([Task("m") for _ in range(n)], Task("cb")).enqueue(client)
        await asyncio.wait_for(ran.wait(), 60)

        async def acknowledged() -> bool:
            return await redis.llen(keys.active_key(Q)) == 0

        await wait_until(acknowledged, within=30, what="callback acknowledged")
        used = delta(before, await command_calls(redis))
    finally:
        await server.shutdown()
    # start, fetch, acknowledge, hand-off and the worker's own polls, scripts' commands included
    assert sum(used.values()) <= 15 * n, used
    # the members' successes went through the batched acknowledgement, not one call each
    assert used["evalsha"] < n // 2, used


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_worker_killed_mid_batch_loses_no_step_and_counts_none_twice(
    redis_url: str, redis: Redis
) -> None:
    n = 400
    timings = [
        "lease=2",
        "heartbeat=0.3",
        "recoverer_interval=0.3",
        "recoverer_cutoff=0.5",
        "delayed_check=0.2",
        "task_check=0.2",
        "shutdown_timeout=5",
    ]
    async with Client(redis) as client:
        # retention on the callback keeps the workflow's state readable afterwards
        info = await chord(
            [Task("wf:member", b"2") for _ in range(n)],
            Task("wf:callback", retention=timedelta(minutes=5)),
        ).enqueue(client)
    wkey = workflow_key(Q, info.id)
    victim = spawn("workflow_worker.py", redis_url, "concurrency=50", *timings)
    finisher = None
    try:
        await wait_for_line(victim, "send signal TERM or INT")

        async def some_acknowledged() -> bool:
            left = await redis.hget(wkey, "left:0")
            return left is not None and int(left) < n - 60

        # killed while it acknowledges batch after batch, with handlers running
        await wait_until(some_acknowledged, within=60, interval=0.005, what="acks under way")
        victim.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.wait, 10)
        left_at_kill = int(await redis.hget(wkey, "left:0") or 0)
        assert 0 < left_at_kill < n
        finisher = spawn("workflow_worker.py", redis_url, "concurrency=50", *timings)
        await wait_for_line(finisher, "send signal TERM or INT")

        async def finished() -> bool:
            return await redis.llen(CALLBACKS) == 1 and not await redis.llen(keys.active_key(Q))

        await wait_until(finished, within=120, interval=0.1, what="the callback ran")
    finally:
        stop_process(victim)
        if finisher is not None:
            stop_process(finisher)
    wf = await read_workflow(redis, Q, info.id)
    assert wf is not None and wf.state == "succeeded"
    assert [s.state for s in wf.stages[0]] == ["succeeded"] * n  # no step lost
    assert [s.result for s in wf.stages[0]] == [b"2"] * n
    assert await redis.hget(wkey, "left:0") == b"0"  # none counted twice
    (entry,) = await redis.lrange(CALLBACKS, 0, -1)
    assert int(entry.split()[-1]) == n  # the callback once, with every member's result
    runs = await redis.lrange(STARTS, 0, -1)
    ran = {e.split()[0].decode() for e in runs}
    assert ran >= {s.id for s in wf.stages[0]}


@pytest.mark.parametrize("first", ["step", "plain"])
async def test_a_batch_whose_workflow_hash_is_damaged_writes_nothing(
    redis: Redis, client: Client, broker: Broker, first: str
) -> None:
    # The step's workflow hash is checked before the batch's first write, whichever
    # place the step has in the batch: a batch that cannot record it acknowledges
    # nothing (the tasks stay active, their leases run out, the recoverer retries).
    info = await chord([Task("m") for _ in range(2)], Task("cb")).enqueue(client)
    await client.enqueue(Task("plain", retention=timedelta(minutes=1)))
    got = await transitions.dequeue_many(broker, [Q], 3)
    step = next(d.message for d in got if d.message.type == "m")
    plain = next(d.message for d in got if d.message.type == "plain")
    items = [(step, False), (plain, True)]
    if first == "plain":
        items.reverse()
    wkey = workflow_key(Q, info.id)
    await redis.delete(wkey)
    await redis.rpush(wkey, "damaged")
    before = await dump_all(redis)
    results = await broker.ack_many(items)
    assert all(r is not None and "WRONGTYPE" in str(r) for r in results)
    assert await dump_all(redis) == before


async def test_a_step_whose_task_hash_is_gone_is_not_recorded(
    redis: Redis, client: Client, broker: Broker
) -> None:
    # Still in active and leased, but its hash deleted (by hand, or a lost write):
    # the step is not found, and its workflow does not count it as done.
    info = await chord([Task("m") for _ in range(2)], Task("cb")).enqueue(client)
    got = await transitions.dequeue_many(broker, [Q], 2)
    gone, kept = got[0].message, got[1].message
    await redis.delete(keys.task_key(Q, gone.id))
    results = await broker.ack_many([(gone, False), (kept, False)])
    assert isinstance(results[0], TaskNotFoundError) and results[1] is None
    wf = await read_workflow(redis, Q, info.id)
    assert wf is not None and wf.stage == 0
    states = {s.id: s.state for s in wf.stages[0]}
    assert (states[gone.id], states[kept.id]) == ("pending", "succeeded")
    assert await redis.hget(workflow_key(Q, info.id), "left:0") == b"1"
    assert await redis.get(keys.processed_total_key(Q)) == b"1"


@pytest.mark.parametrize("how", ["batch", "single"])
async def test_a_workflow_finished_by_its_last_step_records_the_unix_second(
    redis: Redis, client: Client, broker: Broker, clock: FakeClock, how: str
) -> None:
    # The last step kept for a retention keeps the workflow's state that long, with
    # the second it finished (what Inspector.get_workflow shows).
    info = await chain(Task("a"), Task("b", retention=timedelta(minutes=1))).enqueue(client)
    for complete in (False, True):
        got = await transitions.dequeue(broker, [Q])
        assert got is not None
        if how == "batch":
            assert await broker.ack_many([(got.message, complete)]) == [None]
        else:
            await ack_step(broker, got.message, "complete" if complete else "done")
    wf = await read_workflow(redis, Q, info.id)
    assert wf is not None and wf.state == "succeeded"
    assert wf.finished == int(clock.now)
    assert 0 < await redis.ttl(workflow_key(Q, info.id)) <= 60


@pytest.mark.parametrize("seconds", [0, 1])
async def test_a_finished_workflow_is_kept_for_its_retention_of_even_one_second(
    redis: Redis, client: Client, broker: Broker, seconds: int
) -> None:
    # The state is kept for the retention (EXPIRE), or deleted without one. For one
    # second, which command ran, not the key read back: a second may pass before it is.
    info = await chain(Task("a", retention=timedelta(seconds=seconds))).enqueue(client)
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    complete = seconds > 0  # kept: no DEL of the task's hash either
    before = await command_calls(redis)
    assert await broker.ack_many([(got.message, complete)]) == [None]
    used = delta(before, await command_calls(redis))
    if seconds:
        assert (used.get("expire"), used.get("del")) == (1, None)
        assert await redis.hget(keys.task_key(Q, got.message.id), "state") == b"completed"
    else:
        assert await redis.exists(workflow_key(Q, info.id)) == 0


async def test_a_workflow_canceled_with_no_member_out_is_kept_for_even_one_second(
    redis: Redis, client: Client, broker: Broker
) -> None:
    # As above, for workflow_cancel.lua's settling.
    info = await chain(Task("a"), Task("b", retention=timedelta(seconds=1))).enqueue(client)
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    assert await broker.ack_many([(got.message, False)]) == [None]  # b is pending
    before = await command_calls(redis)
    assert await cancel_workflow(redis, Q, info.id, time.time()) == "running"
    used = delta(before, await command_calls(redis))
    assert (used.get("expire"), used.get("del")) == (1, 1)  # the DEL: b's task hash
