"""The per-task select (``asyncq/_worker/select.py``) on its own: which event is first, what
its scope swallows and lets through, and the deadline heap's timer and bound.

The same select under a processor, on the fake broker, is in test_attempt_race.py."""

from __future__ import annotations

import asyncio

import pytest

from asyncq._worker.select import DEADLINE, Deadlines, FirstOf

FAR = 3600.0  # a deadline that never comes during a test


def _futures() -> tuple[asyncio.Future[None], asyncio.Future[None]]:
    loop = asyncio.get_running_loop()
    return loop.create_future(), loop.create_future()


async def test_the_first_event_wins_and_the_wake_is_taken_back() -> None:
    lease, cancel = _futures()
    deadlines = Deadlines(asyncio.get_running_loop())
    select = FirstOf((lease, cancel), deadlines.loop.time() + FAR, deadlines)

    def both() -> None:  # two events in one turn: the first one set is first
        lease.set_result(None)
        cancel.set_result(None)

    asyncio.get_running_loop().call_soon(both)
    with select:
        await asyncio.sleep(FAR)  # woken by the select, which swallows its cancellation
    assert select.first is lease and select.came()
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0  # taken back: nothing pending


async def test_an_event_before_the_handler_s_end_is_first_though_unheard() -> None:
    lease, cancel = _futures()
    deadlines = Deadlines(asyncio.get_running_loop())
    select = FirstOf((lease, cancel), deadlines.loop.time() + FAR, deadlines)
    with select:
        cancel.set_result(None)  # the handler's last step; no await after it
    assert select.first is cancel


async def test_a_handler_turning_its_stop_into_an_error_raises_it() -> None:
    lease, cancel = _futures()
    deadlines = Deadlines(asyncio.get_running_loop())
    select = FirstOf((lease, cancel), deadlines.loop.time() + FAR, deadlines)
    asyncio.get_running_loop().call_soon(lease.set_result, None)
    with pytest.raises(ValueError, match="cleanup failed"), select:
        try:
            await asyncio.sleep(FAR)
        except asyncio.CancelledError:
            raise ValueError("cleanup failed") from None
    assert select.first is lease


async def test_a_cancellation_from_outside_goes_through_the_scope() -> None:
    lease, cancel = _futures()
    deadlines = Deadlines(asyncio.get_running_loop())
    entered = asyncio.Event()
    selects: list[FirstOf] = []

    async def handler() -> None:
        select = FirstOf((lease, cancel), deadlines.loop.time() + FAR, deadlines)
        selects.append(select)
        with select:
            entered.set()
            await asyncio.sleep(FAR)

    task = asyncio.get_running_loop().create_task(handler())
    await entered.wait()
    lease.set_result(None)  # the select wakes it ...
    task.cancel()  # ... and the loop's shutdown cancels it in the same turn
    with pytest.raises(asyncio.CancelledError):
        await task
    assert selects[0].first is lease


async def test_the_deadline_is_an_event_too() -> None:
    lease, cancel = _futures()
    deadlines = Deadlines(asyncio.get_running_loop())
    select = FirstOf((lease, cancel), deadlines.loop.time() + 0.01, deadlines)
    with select:
        await asyncio.sleep(FAR)
    assert select.first is DEADLINE


async def test_deadlines_come_in_order_on_one_timer_without_spinning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    runs = 0
    come = Deadlines._come

    def counted(self: Deadlines) -> None:
        nonlocal runs
        runs += 1
        come(self)

    monkeypatch.setattr(Deadlines, "_come", counted)
    now = loop.time()
    order: list[str] = []

    async def wait(name: str, after: float) -> None:
        with FirstOf((), now + after, deadlines):
            await asyncio.sleep(FAR)
        order.append(name)

    async with asyncio.TaskGroup() as group:
        group.create_task(wait("late", 0.3))
        group.create_task(wait("middle", 0.15))
        group.create_task(wait("early", 0.05))
    assert order == ["early", "middle", "late"]
    assert runs <= 6  # the timer ran for each deadline (twice at most), never in a loop
    deadlines.add(loop.time() + 0.01, _Waiting())  # type: ignore[arg-type]
    assert deadlines._timer is not None  # a deadline after the last one came sets the timer


async def test_ended_selects_leave_the_heap_and_waiting_ones_still_come() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    firsts: list[object] = []

    async def waiting() -> None:
        select = FirstOf((), loop.time() + 0.2, deadlines)
        with select:
            await asyncio.sleep(FAR)
        firsts.append(select.first)

    tasks = [loop.create_task(waiting()) for _ in range(3)]
    await asyncio.sleep(0)  # all three waiting in their selects
    assert deadlines.waiting == 3
    for _ in range(10_000):  # tasks that end long before their half-hour deadline
        with FirstOf((), loop.time() + 1800, deadlines):
            pass
        assert len(deadlines._heap) <= 64 + 2 * deadlines.waiting + 1
    await asyncio.gather(*tasks)
    assert firsts == [DEADLINE] * 3  # kept through every rebuild of the heap


class _Waiting:
    _task = "waiting"

    def deadline_came(self) -> None:
        pass


async def test_after_a_deadline_the_timer_is_set_for_the_next_earliest() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    came: list[str] = []

    async def wait(name: str, after: float) -> None:
        select = FirstOf((), loop.time() + after, deadlines)
        with select:
            await asyncio.sleep(FAR)
        came.append(name)

    far = loop.create_task(wait("far", FAR))  # never comes: only its entry stays
    await asyncio.gather(wait("first", 0.02), wait("second", 0.05))
    assert came == ["first", "second"]  # the second came by the timer set after the first
    far.cancel()
    with pytest.raises(asyncio.CancelledError):
        await far


async def test_a_moved_deadline_comes_at_its_new_time_and_not_at_its_old_one() -> None:
    lease, cancel = _futures()
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    select = FirstOf((lease, cancel), loop.time() - 1.0, deadlines)  # due already
    with select:
        select.move_deadline(FAR)  # before the timer ran: the old time is passed over
        for _ in range(3):
            await asyncio.sleep(0)  # the timer for the old time runs in these turns
        assert select.first is None
        select.move_deadline(-2 * FAR)  # back to before now: due again
        await asyncio.sleep(FAR)  # woken by the select
    assert select.first == DEADLINE


async def test_a_rebuilt_heap_keeps_only_the_current_deadline_of_each_waiting_select() -> None:
    lease, cancel = _futures()
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    when = loop.time() + FAR
    waiting = FirstOf((lease, cancel), when, deadlines)
    with waiting:
        for _ in range(200):  # an attempt whose inline steps moved its deadline on
            waiting.move_deadline(1.0)
        other = FirstOf(_futures(), loop.time() + FAR, deadlines)
        with other:
            pass  # leaving rebuilds the heap: 202 entries for 1 waiting select
        assert [(entry[0], entry[2]) for entry in deadlines._heap] == [(waiting._deadline, waiting)]
        assert waiting._deadline == pytest.approx(when + 200.0)
