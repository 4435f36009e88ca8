"""A run waiting for steps keeps its coroutine on its worker (:class:`ParkedRuns`): when
its step's success wakes it there, the next attempt resumes the coroutine where it
waited instead of replaying the function from the top. The record stays the truth:
a coroutine whose record moved on without it is discarded (its exits run) and the run
replays. :func:`drive` runs the coroutine as if awaited by the attempt's task."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import Server, durable
from asyncq import _keys as keys
from asyncq._broker.durable import RunSuspended, SuspendPlan
from asyncq.durable import Finished, Parked, ParkedRuns, Run, _Park, discard, drive
from tests.support import durable_app as d
from tests.support.helpers import wait_until


@pytest.fixture(autouse=True)
def counters(gate: None) -> None:
    d.entered.clear()
    d.unwound.clear()


async def test_a_run_continued_on_its_worker_resumes_where_it_waited(
    redis: Redis, worker: Server
) -> None:
    handle = await d.counted.start(1, False)
    assert await handle.result(timeout=20) == 4
    # three steps, each continuing the run here: entered once, never replayed or unwound
    assert d.entered == [handle.id]
    assert d.unwound == []
    assert worker.stats.continued == 6  # each step in its run's slot, and back
    record = await redis.hgetall(keys.run_key(d.QUEUE, handle.id))
    assert record[b"state"] == b"succeeded"
    assert [record[f"r:{i}".encode()] for i in range(3)] == [b"2", b"3", b"4"]
    assert len(d.counted._parked) == 0  # taken by the attempt that resumed it


async def test_a_parked_coroutine_whose_record_moved_on_is_discarded_and_the_run_replays(
    redis: Redis, worker: Server
) -> None:
    handle = await d.counted.start(1, True)
    await wait_until(lambda: len(d.counted._parked) == 1, what="the run parked on its step")
    parked = d.counted._parked._runs[handle.id]
    # As if another attempt had decided entry 0 otherwise: the parked coroutine's
    # knowledge no longer matches the record, so it must not go on.
    parked.run._record["s:0"] = b"step d:gated another"
    d.gate["open"].set()
    assert await handle.result(timeout=20) == 104
    # discarded (its exit ran, driven: the `await` in its except block worked), then
    # replayed from the top, then resumed in place for the three later steps
    assert d.unwound == [handle.id]
    assert d.entered == [handle.id, handle.id]


async def test_steps_awaited_in_tasks_of_their_own_suspend_and_replay(
    redis: Redis, worker: Server
) -> None:
    handle = await d.grouped.start(5)
    assert await handle.result(timeout=20) == [6, 10]


def run_with(record: dict[str, bytes], *, at: int, writes: dict[str, bytes]) -> Run:
    run = Run("r1", "q", record, redis=None)  # type: ignore[arg-type]  # never reads
    run._next = at
    run._writes = dict(writes)
    return run


def test_a_parked_run_resumes_only_from_a_record_holding_all_it_knows_and_no_more() -> None:
    known = {"s:0": b"step a {}", "r:0": b"1", "state": b"running", "w:1": b"1"}
    run = run_with(known, at=2, writes={"s:1": b"step b {}", "d:1": b"5.0"})
    moved = {"s:0": b"step a {}", "r:0": b"1", "s:1": b"step b {}", "d:1": b"5.0"}
    # what changes between attempts (state, waits) does not matter; entries do
    assert run._resumes_from({**moved, "state": b"waiting", "r:1": b"2"})
    assert not run._resumes_from({**moved, "s:2": b"step c {}"})  # went further elsewhere
    assert not run._resumes_from({**moved, "r:0": b"7"})  # another result
    assert not run._resumes_from({k: v for k, v in moved.items() if k != "s:1"})  # unwritten
    assert not run._resumes_from({k: v for k, v in moved.items() if k != "d:1"})
    assert not run._resumes_from({})  # expired, or another run of the same id
    run._resume({**moved, "r:1": b"2"})
    assert run._writes == {} and run._field("r:1") == b"2"


async def test_parked_runs_keep_the_newest_within_the_limit_and_the_age(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    parked = ParkedRuns(clock=lambda: now[0])
    monkeypatch.setattr(durable, "PARKED_LIMIT", 2)

    def park(run_id: str) -> list[str]:
        coro = asyncio.sleep(0)
        coro.close()  # never driven here
        return [p.run.id for p in parked.keep(Run(run_id, "q", {}, redis=None), coro)]  # type: ignore[arg-type]

    assert park("a") == [] and park("b") == []
    assert park("c") == ["a"]  # over the limit: the oldest goes
    now[0] = durable.PARKED_SECONDS - 1
    assert park("d") == ["b"]
    now[0] = durable.PARKED_SECONDS + 0.5  # c is too old now; d is not
    assert park("e") == ["c"]
    assert len(parked) == 2
    taken = parked.take("d")
    assert taken is not None and taken.run.id == "d" and parked.take("d") is None


async def test_drive_runs_the_coroutine_as_if_awaited_and_ends_on_a_park() -> None:
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    plan = SuspendPlan("steps", waits=[0])
    seen: list[object] = []

    async def fn() -> str:
        await asyncio.sleep(0)  # a bare yield passes through
        seen.append(await fut)  # a future another task resolves
        async with asyncio.timeout(5):  # cancels the driving task: thrown through drive
            await asyncio.sleep(0)
        await _Park(plan)
        seen.append("resumed")
        return "done"

    coro = fn()
    asyncio.get_running_loop().call_soon(fut.set_result, 7)
    assert await drive(coro) is plan
    assert seen == [7]
    ended = await drive(coro)
    assert isinstance(ended, Finished) and ended.value == "done"
    assert seen == [7, "resumed"]


async def test_drive_throws_the_cancellation_of_its_task_into_the_coroutine() -> None:
    started = asyncio.Event()
    caught: list[str] = []

    async def fn() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            caught.append("cancelled")
            raise

    driver = asyncio.create_task(drive(fn()))
    await started.wait()
    driver.cancel()
    with pytest.raises(asyncio.CancelledError):
        await driver
    assert caught == ["cancelled"]

    async def timed() -> str:
        try:
            async with asyncio.timeout(0):
                await asyncio.Event().wait()
        except TimeoutError:
            return "timed out"
        return "not reached"

    ended = await drive(timed())
    assert isinstance(ended, Finished) and ended.value == "timed out"


async def test_a_discarded_coroutine_unwinds_as_a_suspension_with_its_async_exits() -> None:
    exits: list[str] = []

    async def waits() -> None:
        try:
            await _Park(SuspendPlan("steps"))
        except RunSuspended:
            await asyncio.sleep(0)  # an async exit: driven, not closed
            exits.append("unwound")
            raise

    coro = waits()
    assert isinstance(await drive(coro), SuspendPlan)
    await discard(coro)
    assert exits == ["unwound"]

    async def stubborn() -> Any:
        while True:
            try:
                await _Park(SuspendPlan("steps"))
            except RunSuspended:
                exits.append("swallowed")

    coro2 = stubborn()
    assert isinstance(await drive(coro2), SuspendPlan)
    await discard(coro2)  # it parks again: closed
    assert exits == ["unwound", "swallowed"]
    assert coro2.cr_frame is None  # closed


def test_coroutines_parked_in_another_event_loop_are_closed_not_resumed() -> None:
    parked = ParkedRuns()
    closed: list[str] = []

    async def waits() -> None:
        try:
            await _Park(SuspendPlan("steps"))
        finally:
            closed.append("closed")

    async def park_one() -> None:
        coro = waits()
        assert isinstance(await drive(coro), SuspendPlan)
        assert parked.keep(Run("r1", "q", {}, redis=None), coro) == []  # type: ignore[arg-type]

    async def take_one() -> Parked | None:
        return parked.take("r1")

    asyncio.run(park_one())
    assert len(parked) == 1 and closed == []
    assert asyncio.run(take_one()) is None  # another loop: closed, the run replays
    assert closed == ["closed"] and len(parked) == 0
