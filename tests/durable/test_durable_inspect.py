"""Durable runs seen and steered through the Inspector: listing and inspecting runs,
signalling them, cancelling a waiting and a running run (durable_cancel.lua), and the
cancel script at its edges (a damaged key or a moved task changes nothing)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from asyncq import (
    DurableFunction,
    DurableRunNotFoundError,
    Inspector,
    QueueNotFoundError,
    Server,
    TaskHandle,
    TaskState,
)
from asyncq import _keys as keys
from asyncq._broker._base import ARCHIVE_MAX_SIZE, ARCHIVED_EXPIRATION
from asyncq._broker.durable import FAILED_RUN_KEPT, PENDING_RUN_KEPT, settle_run
from asyncq._broker.durable_cancel import CANCELED_ERROR, cancel_run
from asyncq._inspection.durable_runs import run_state
from asyncq.errors import BrokerError
from tests.support import durable_app as d
from tests.support.helpers import wait_until

Q = d.QUEUE


@pytest.fixture
async def insp(redis: Redis) -> AsyncIterator[Inspector]:
    async with Inspector(redis) as inspector:
        yield inspector


async def waiting(insp: Inspector, run_id: str, kind: str = "signal") -> bool:
    """Whether the run waits for a *kind* (not for a step it took on the way)."""
    try:
        wait = (await insp.get_durable_run(Q, run_id)).waiting_for
    except DurableRunNotFoundError:
        return False
    return wait is not None and wait.kind == kind


async def test_runs_are_listed_and_inspected(insp: Inspector, worker: Server) -> None:
    done = await d.chain3.start(4)
    assert await done.result(timeout=20) == 55
    signalled = await d.waiter.start("k 1", None)
    sleeping = await d.sleeper.start(3600)
    await wait_until(lambda: waiting(insp, signalled.id), what="the waiter waits")
    await wait_until(lambda: waiting(insp, sleeping.id, "sleep"), what="the sleeper waits")

    info = await insp.get_durable_run(Q, done.id)
    assert (info.state, info.type, info.task_state) == ("completed", "d:chain", "completed")
    assert info.updated is not None
    assert [(e.kind, e.step_id, e.result) for e in info.entries] == [
        ("step", f"{done.id}-0", b"5"),
        ("step", f"{done.id}-1", b"50"),
        ("step", f"{done.id}-2", b"55"),
    ]
    assert info.entries[1].signature == 'step d:mul {"a":5,"b":10}'
    assert (info.steps_done, info.steps_total, info.waiting_for) == (3, 3, None)

    info = await insp.get_durable_run(Q, signalled.id)
    assert info.waiting_for is not None
    # a key holding a space: the signature is split where the waiting-runs set says
    assert (info.waiting_for.kind, info.waiting_for.signal_name) == ("signal", "go")
    assert info.waiting_for.signal_key == "k 1" and info.waiting_for.until is None
    assert info.waiting_for.describe() == "signal go / k 1"
    assert [(e.kind, e.waited_for, e.recorded) for e in info.entries] == [("wait", True, False)]

    info = await insp.get_durable_run(Q, sleeping.id)
    assert info.waiting_for is not None and info.waiting_for.kind == "sleep"
    assert info.waiting_for.until is not None and info.entries[1].deadline is not None
    assert [e.kind for e in info.entries] == ["now", "sleep"] and info.entries[1].waited_for

    page = await insp.durable_runs(Q)
    assert page.cursor is None
    rows = {r.id: (r.type, r.state, r.steps_done, r.steps_total) for r in page.runs}
    assert rows == {
        done.id: ("d:chain", "completed", 3, 3),
        signalled.id: ("d:waiter", "waiting", 0, 0),
        sleeping.id: ("d:sleeper", "waiting", 0, 0),
    }
    # one row a page: the cursors walk every run once
    seen, cursor = [], None
    while True:
        one = await insp.durable_runs(Q, limit=1, cursor=cursor)
        seen += [r.id for r in one.runs]
        if (cursor := one.cursor) is None:
            break
    assert sorted(seen) == sorted(rows)

    # the Inspector's signal is App.signal's: the waiting run takes it and ends
    assert await insp.signal(Q, "go", key="k 1", payload={"a": [1, "<b>"]}) == 1
    assert await signalled.result(timeout=20) == {"got": {"a": [1, "<b>"]}}
    info = await insp.get_durable_run(Q, signalled.id)
    assert info.state == "completed" and info.entries[0].result == b'{"a":[1,"<b>"]}'
    assert await insp.signal(Q, "go", key="nobody") == 0  # kept for the first wait


async def test_a_run_not_attempted_yet_is_listed_and_inspected_as_pending(
    insp: Inspector, redis: Redis, app: None
) -> None:
    handle = await d.chain3.start(4)  # no worker: it waits for its first attempt
    info = await insp.get_durable_run(Q, handle.id)
    assert (info.state, info.type, info.task_state) == ("pending", "d:chain", "pending")
    assert (info.entries, info.waiting_for, info.updated, info.last_error) == ([], None, None, None)
    page = await insp.durable_runs(Q)
    assert [(r.id, r.state, r.entries) for r in page.runs] == [(handle.id, "pending", 0)]
    # its record keeps nothing but its state, and is dropped if no attempt ever writes it
    run = keys.run_key(Q, handle.id)
    assert await redis.hgetall(run) == {b"state": b"pending"}
    assert PENDING_RUN_KEPT - 5 <= await redis.ttl(run) <= PENDING_RUN_KEPT
    # to Go's CLI it is an ordinary pending task
    assert await redis.lrange(keys.pending_key(Q), 0, -1) == [handle.id.encode()]
    assert await redis.hget(keys.task_key(Q, handle.id), "state") == b"pending"
    assert Q.encode() in await redis.smembers(keys.ALL_QUEUES)


async def test_a_pending_run_runs_as_started_and_keeps_its_record(
    insp: Inspector, redis: Redis, app: None
) -> None:
    handle = await d.chain3.start(4)
    server = await d.start_worker()
    try:
        assert await handle.result(timeout=20) == 55
    finally:
        await server.shutdown()
    info = await insp.get_durable_run(Q, handle.id)
    assert (info.state, info.steps_done) == ("completed", 3)


async def test_a_run_whose_task_was_deleted_before_its_first_attempt_is_gone(
    insp: Inspector, redis: Redis, app: None
) -> None:
    handle = await d.chain3.start(4)
    kept = await d.chain3.start(5)
    await insp.delete_task(Q, handle.id)  # as `asynq task delete` does: the record stays
    with pytest.raises(DurableRunNotFoundError):
        await insp.get_durable_run(Q, handle.id)
    with pytest.raises(DurableRunNotFoundError):
        await insp.cancel_durable_run(Q, handle.id)
    assert [r.id for r in (await insp.durable_runs(Q)).runs] == [kept.id]
    assert await redis.ttl(keys.run_key(Q, handle.id)) > 0  # Redis drops it in time


async def test_cancelling_a_run_not_attempted_yet_archives_it(
    insp: Inspector, redis: Redis, app: None
) -> None:
    handle = await d.chain3.start(4)
    assert await insp.cancel_durable_run(Q, handle.id) == "pending"
    info = await insp.get_durable_run(Q, handle.id)
    assert (info.state, info.task_state, info.last_error) == (
        "cancelled", "archived", CANCELED_ERROR,
    )  # fmt: skip
    assert await redis.llen(keys.pending_key(Q)) == 0
    assert await redis.ttl(keys.run_key(Q, handle.id)) >= ARCHIVED_EXPIRATION - 5
    assert await insp.cancel_durable_run(Q, handle.id) == "cancelled"


async def test_cancelling_a_waiting_run_archives_it_and_keeps_its_record(
    redis: Redis, insp: Inspector, worker: Server
) -> None:
    handle = await d.fickle.start()  # a step, then a wait for the signal fickle/k
    await wait_until(lambda: waiting(insp, handle.id), what="the run waits")
    assert await insp.cancel_durable_run(Q, handle.id) == "waiting"
    info = await insp.get_durable_run(Q, handle.id)
    assert (info.state, info.task_state, info.waiting_for) == ("cancelled", "archived", None)
    assert info.last_error == CANCELED_ERROR
    assert info.entries[0].result == b"5"  # the recorded step is kept
    assert await redis.zscore(keys.scheduled_key(Q), handle.id) is None
    assert await redis.zscore(keys.archived_key(Q), handle.id) is not None
    assert await redis.ttl(keys.run_key(Q, handle.id)) > 0
    # it left the signal's wait: a signal finds no run and is kept
    assert not await redis.exists(keys.awaiting_key(Q, "fickle", "k"))
    assert await insp.signal(Q, "fickle", key="k") == 0
    assert await insp.cancel_durable_run(Q, handle.id) == "cancelled"  # nothing changes
    assert [r.state for r in (await insp.durable_runs(Q)).runs] == ["cancelled"]


async def held_attempt(redis: Redis, fn: DurableFunction[[], int]) -> TaskHandle[int]:
    """A run of *fn* started, its attempt held in ``d.held`` (the gate shut) until the test
    opens ``d.hold["gate"]``."""
    d.hold["gate"] = asyncio.Event()
    handle = await fn.start()
    await wait_until(lambda: redis.hexists(d.CALLS, "held"), what="the attempt holds")
    return handle


async def test_cancelling_a_running_run_stops_its_attempt(
    redis: Redis, insp: Inspector, worker: Server
) -> None:
    handle = await held_attempt(redis, d.held_run)
    assert (await insp.get_durable_run(Q, handle.id)).state == "running"
    assert await insp.cancel_durable_run(Q, handle.id) == "running"

    async def cancelled() -> bool:
        return (await insp.get_durable_run(Q, handle.id)).state == "cancelled"

    await wait_until(cancelled, what="the stopped attempt archived")
    info = await insp.get_task(Q, handle.id)
    assert info.state is TaskState.ARCHIVED
    assert (await insp.get_durable_run(Q, handle.id)).entries[0].result == b"3"


async def test_cancelling_a_run_in_its_first_attempt_stops_it(
    redis: Redis, insp: Inspector, worker: Server
) -> None:
    handle = await held_attempt(redis, d.held_first)
    assert await redis.hget(keys.run_key(Q, handle.id), "state") == b"pending"
    assert (await insp.get_durable_run(Q, handle.id)).state == "running"
    assert await insp.cancel_durable_run(Q, handle.id) == "running"

    async def cancelled() -> bool:
        return (await insp.get_durable_run(Q, handle.id)).state == "cancelled"

    await wait_until(cancelled, what="the stopped attempt archived")
    assert (await insp.get_task(Q, handle.id)).state is TaskState.ARCHIVED


async def test_hostile_names_get_clear_errors(insp: Inspector, client: object) -> None:
    await insp.redis.sadd(keys.ALL_QUEUES, Q)
    with pytest.raises(DurableRunNotFoundError, match="durable run not found: id='nope'"):
        await insp.get_durable_run(Q, "nope")
    with pytest.raises(DurableRunNotFoundError):
        await insp.cancel_durable_run(Q, "nope")
    with pytest.raises(ValueError, match="run ID 'a}b' holds"):
        await insp.get_durable_run(Q, "a}b")
    with pytest.raises(ValueError, match="run ID cannot be empty"):
        await insp.cancel_durable_run(Q, " ")
    with pytest.raises(QueueNotFoundError):
        await insp.get_durable_run("no such queue", "x")
    with pytest.raises(ValueError):
        await insp.durable_runs("q{1}")
    with pytest.raises(ValueError, match=r"signal name 'a\{' holds"):
        await insp.signal(Q, "a{")
    with pytest.raises(ValueError, match="not JSON"):
        await insp.signal(Q, "a", payload=object())
    with pytest.raises(ValueError, match="invalid durable run cursor"):
        await insp.durable_runs(Q, cursor="x")


async def test_the_cancel_script_changes_nothing_on_a_damaged_key_or_a_moved_task(
    redis: Redis,
) -> None:
    run, task = keys.run_key(Q, "r1"), keys.task_key(Q, "r1")
    await redis.hset(run, mapping={"s:0": "sleep", "state": "waiting", "until": "9"})
    await redis.hset(task, mapping={"msg": b"m", "state": "scheduled"})
    await redis.zadd(keys.scheduled_key(Q), {"r1": 9})
    before = {k: await redis.dump(k) for k in await redis.keys("*")}
    args = {"archived_msg": b"m2", "signal": None, "expire_in": 60, "now": 10.0}
    assert await cancel_run(redis, Q, "r1", task_state="pending", **args) == "moved"
    await redis.set(keys.archived_key(Q), "not a zset")
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await cancel_run(redis, Q, "r1", task_state="scheduled", **args)
    await redis.delete(keys.archived_key(Q))
    assert {k: await redis.dump(k) for k in await redis.keys("*")} == before
    assert await cancel_run(redis, Q, "gone", task_state="", **args) == "gone"
    assert await cancel_run(redis, Q, "r1", task_state="scheduled", **args) == "waiting"
    assert await redis.hget(task, "state") == b"archived"
    assert await redis.hget(run, "state") == b"cancelled"


@pytest.mark.parametrize(
    ("recorded", "task", "state"),
    [
        ("succeeded", None, "completed"),
        ("failed", TaskState.ARCHIVED, "failed"),
        ("cancelled", TaskState.ACTIVE, "running"),  # its attempt is being stopped
        ("cancelled", TaskState.ARCHIVED, "cancelled"),
        ("waiting", TaskState.SCHEDULED, "waiting"),
        ("waiting", TaskState.PENDING, "running"),  # woken by its time, a step or a signal
        ("waiting", TaskState.ARCHIVED, "failed"),  # archived by hand
        ("running", TaskState.RETRY, "running"),
        (None, TaskState.COMPLETED, "completed"),
        ("pending", TaskState.PENDING, "pending"),  # started, not attempted yet
        ("pending", TaskState.RETRY, "pending"),  # its first attempt's worker died
        ("pending", TaskState.ACTIVE, "running"),  # its first attempt runs
        ("pending", TaskState.ARCHIVED, "failed"),
    ],
)
def test_a_runs_state_from_its_record_and_its_task(
    recorded: str | None, task: TaskState | None, state: str
) -> None:
    assert run_state(recorded, task) == state


def cancel_args(**over: object) -> dict[str, object]:
    return {"archived_msg": b"m2", "signal": None, "expire_in": 60, "now": 10.0, **over}


async def parked(redis: Redis, state: str) -> None:
    """Run r1 with a record (waiting in a sleep) and its task in *state*."""
    await redis.hset(
        keys.run_key(Q, "r1"), mapping={"s:0": "sleep", "state": "waiting", "until": "9"}
    )
    await redis.hset(keys.task_key(Q, "r1"), mapping={"msg": b"m", "state": state})


@pytest.mark.parametrize(
    "damaged", ["record", "task", "archived", "awaiting", "pending", "scheduled", "retry"]
)
async def test_the_cancel_script_checks_every_key_before_its_first_write(
    redis: Redis, damaged: str
) -> None:
    await parked(redis, "scheduled")
    await redis.zadd(keys.scheduled_key(Q), {"r1": 9})
    key = {
        "record": keys.run_key(Q, "r1"),
        "task": keys.task_key(Q, "r1"),
        "archived": keys.archived_key(Q),
        "awaiting": keys.awaiting_key(Q, "go", "k"),
        "pending": keys.pending_key(Q),
        "scheduled": keys.scheduled_key(Q),
        "retry": keys.retry_key(Q),
    }[damaged]
    await redis.delete(key)
    await redis.set(key, "x")
    before = {k: await redis.dump(k) for k in await redis.keys("*")}
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await cancel_run(
            redis, Q, "r1", task_state="scheduled", **cancel_args(signal=("go", "k", 0))
        )
    assert {k: await redis.dump(k) for k in await redis.keys("*")} == before


@pytest.mark.parametrize("ended", ["succeeded", "failed", "cancelled"])
async def test_cancelling_an_ended_run_changes_nothing(redis: Redis, ended: str) -> None:
    await parked(redis, "archived")
    await redis.hset(keys.run_key(Q, "r1"), "state", ended)
    before = {k: await redis.dump(k) for k in await redis.keys("*")}
    assert await cancel_run(redis, Q, "r1", task_state="archived", **cancel_args()) == ended
    assert {k: await redis.dump(k) for k in await redis.keys("*")} == before


@pytest.mark.parametrize(("state", "key"), [("pending", "pending"), ("retry", "retry")])
async def test_cancelling_a_pending_or_retrying_run_takes_it_out_of_its_list(
    redis: Redis, state: str, key: str
) -> None:
    await parked(redis, state)
    if key == "pending":
        await redis.rpush(keys.pending_key(Q), "a", "r1", "b")
    else:
        await redis.zadd(keys.retry_key(Q), {"a": 1, "r1": 2, "b": 3})
    assert await cancel_run(redis, Q, "r1", task_state=state, **cancel_args()) == "waiting"
    if key == "pending":
        assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"a", b"b"]
    else:
        assert await redis.zrange(keys.retry_key(Q), 0, -1) == [b"a", b"b"]
    assert await redis.zscore(keys.archived_key(Q), "r1") == 10
    assert await redis.hmget(keys.task_key(Q, "r1"), "state", "msg") == [b"archived", b"m2"]
    record = await redis.hgetall(keys.run_key(Q, "r1"))
    assert record[b"state"] == b"cancelled" and b"until" not in record
    assert record[b"s:0"] == b"sleep"  # what was recorded stays


async def test_cancelling_trims_the_archive_as_asynq_archives_do(redis: Redis) -> None:
    """The oldest archived tasks past the size limit go, with their task hashes (asynq's
    ZREMRANGEBYRANK 0 -limit); the cancelled run stays however full the archive is."""
    now = 10 * ARCHIVED_EXPIRATION
    await parked(redis, "scheduled")
    archived = keys.archived_key(Q)
    oldest = now - ARCHIVED_EXPIRATION + 1  # within the cutoff: only the size limit trims
    await redis.zadd(archived, {"oldest": oldest})
    await redis.zadd(archived, {f"t{i}": oldest + 1 + i for i in range(ARCHIVE_MAX_SIZE - 1)})
    for kept in ("oldest", "t0", "t1"):
        await redis.hset(keys.task_key(Q, kept), "state", "archived")
    got = await cancel_run(redis, Q, "r1", task_state="scheduled", **cancel_args(now=now))
    assert got == "waiting"
    assert await redis.zscore(archived, "r1") == now
    for gone in ("oldest", "t0"):  # ranks 0 and 1 of 10,001
        assert await redis.zscore(archived, gone) is None
        assert not await redis.exists(keys.task_key(Q, gone))
    assert await redis.exists(keys.task_key(Q, "t1"))
    assert await redis.zcard(archived) == ARCHIVE_MAX_SIZE - 1


async def test_cancelling_drops_archived_tasks_past_the_cutoff(redis: Redis) -> None:
    now = 10 * ARCHIVED_EXPIRATION
    await parked(redis, "scheduled")
    archived = keys.archived_key(Q)
    await redis.zadd(archived, {"expired": now - ARCHIVED_EXPIRATION, "recent": now - 5})
    for member in ("expired", "recent"):
        await redis.hset(keys.task_key(Q, member), "state", "archived")
    await cancel_run(redis, Q, "r1", task_state="scheduled", **cancel_args(now=now))
    assert await redis.zrange(archived, 0, -1) == [b"recent", b"r1"]
    assert not await redis.exists(keys.task_key(Q, "expired"))
    assert await redis.exists(keys.task_key(Q, "recent"))


async def test_a_cancelled_run_is_never_trimmed_from_the_archive_it_joins(redis: Redis) -> None:
    """Servers whose clocks run ahead archived a full archive's worth after this one's
    now: the run this cancel archives is then the oldest, and stays."""
    await parked(redis, "scheduled")
    archived = keys.archived_key(Q)
    await redis.zadd(archived, {f"t{i}": 11 + i for i in range(ARCHIVE_MAX_SIZE)})
    assert await cancel_run(redis, Q, "r1", task_state="scheduled", **cancel_args()) == "waiting"
    assert await redis.zscore(archived, "r1") == 10
    assert await redis.hget(keys.task_key(Q, "r1"), "state") == b"archived"


async def test_a_run_cancelled_while_it_ran_is_archived_by_its_own_suspension(
    redis: Redis, insp: Inspector, worker: Server
) -> None:
    # The race the stop over Pub/Sub can lose: the attempt suspends first. Marked as
    # durable_cancel.lua marks a running run (its stop left out), the suspension finds
    # the mark, writes nothing, and the worker archives the run.
    handle = await held_attempt(redis, d.held_then_step)
    await redis.hset(keys.run_key(Q, handle.id), "state", "cancelled")
    d.hold["gate"].set()

    async def archived() -> bool:
        return (await insp.get_task(Q, handle.id)).state is TaskState.ARCHIVED

    await wait_until(archived, what="the run archived")
    info = await insp.get_task(Q, handle.id)
    assert info.last_error == CANCELED_ERROR
    run = await insp.get_durable_run(Q, handle.id)
    assert run.state == "cancelled"
    assert not await redis.exists(keys.task_key(Q, f"{handle.id}-1"))  # no step enqueued
    assert await redis.hget(keys.run_key(Q, handle.id), "s:1") is None  # nor recorded


async def test_cancelling_a_running_run_keeps_its_record_as_a_failed_runs(
    redis: Redis, insp: Inspector, worker: Server
) -> None:
    # after a step, so that its record has no expiry left from its start
    handle = await held_attempt(redis, d.held_run)
    assert await redis.ttl(keys.run_key(Q, handle.id)) == -1
    assert await insp.cancel_durable_run(Q, handle.id) == "running"
    ttl = await redis.ttl(keys.run_key(Q, handle.id))
    assert FAILED_RUN_KEPT - 60 < ttl <= FAILED_RUN_KEPT
    d.hold["gate"].set()


async def test_a_run_cancelled_while_a_failed_attempt_ran_is_archived_at_its_retry(
    redis: Redis, insp: Inspector, app: None
) -> None:
    # The other race the stop can lose: the attempt fails (and is retried) first. Its
    # settle keeps the mark (durable_settle.lua); the retry ends at once, archived.
    handle = await d.chain3.start(1)
    record = keys.run_key(Q, handle.id)
    await redis.hset(record, "state", "cancelled")  # as durable_cancel.lua left it
    await settle_run(redis, Q, handle.id, "running", records={}, expire_in=0)  # the failure
    assert await redis.hget(record, "state") == b"cancelled"
    server = await d.start_worker()  # the retry's attempt
    try:

        async def archived() -> bool:
            return (await insp.get_task(Q, handle.id)).state is TaskState.ARCHIVED

        await wait_until(archived, what="the retried run archived")
    finally:
        await server.shutdown()
    assert (await insp.get_task(Q, handle.id)).last_error == CANCELED_ERROR
    assert await redis.hget(record, "state") == b"cancelled"
    assert FAILED_RUN_KEPT - 60 < await redis.ttl(record) <= FAILED_RUN_KEPT
    assert not await redis.hexists(d.RAN, f"{handle.id}-0")  # the function did not run
