"""The Scheduler's loops are roles like the Server's: supervised in its TaskGroup (a crash
is restarted with backoff), stopped by request, started with the scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from redis.asyncio import Redis

from asyncq._scheduling.cron import parse_cronspec
from asyncq._scheduling.roles import EntryTicker, SchedulerHeartbeat
from asyncq._scheduling.scheduler import Scheduler
from asyncq._supervision import supervise
from asyncq.task import Task


async def _until(check: Callable[[], bool], what: str, within: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


class _Log:
    def bind(self, **kw: Any) -> _Log:
        return self

    def warning(self, *args: Any, **kw: Any) -> None:
        pass

    info = error = exception = debug = warning


async def test_a_crashed_ticker_is_restarted_and_ticks_again(redis: Redis, redis_url: str) -> None:
    scheduler = Scheduler(redis_url)
    scheduler.register("@every 1s", Task("roles:tick", b""), queue="roles-tick")
    fired: list[datetime] = []
    real_fire = scheduler._start_fire

    def fire_or_crash(entry: Any, tick: datetime) -> None:
        fired.append(tick)
        if len(fired) == 1:
            raise LookupError("a bug in one tick")
        real_fire(entry, tick)

    scheduler._start_fire = fire_or_crash  # type: ignore[method-assign]
    async with scheduler:
        await _until(lambda: len(fired) >= 2, "a tick after the crash")
        [entry] = scheduler._entries.values()
        assert entry.ticker is not None and not entry.ticker.stopping


async def test_roles_run_in_the_scheduler_group_and_end_with_it(redis_url: str) -> None:
    scheduler = Scheduler(redis_url)
    entry_id = scheduler.register("@every 1h", Task("roles:group", b""), queue="roles-group")
    await scheduler.start()
    try:
        entry = scheduler._entries[entry_id]
        tasks = {t.get_name(): t for t in asyncio.all_tasks()}
        ticker_task = tasks[f"asyncq-scheduler-entry-{entry_id}"]
        heartbeat_task = tasks["asyncq-scheduler-heartbeat"]
        assert not ticker_task.done() and not heartbeat_task.done()
        # unregister stops the ticker by request: its task ends on its own
        scheduler.unregister(entry_id)
        await asyncio.wait_for(ticker_task, 10)
        assert entry.ticker is not None and entry.ticker.stopping
        assert not ticker_task.cancelled()
    finally:
        await scheduler.shutdown()
    assert heartbeat_task.done() and not heartbeat_task.cancelled()


async def test_the_heartbeat_role_beats_at_once_when_asked_and_stops_promptly() -> None:
    beats = 0

    async def beat() -> None:
        nonlocal beats
        beats += 1

    role = SchedulerHeartbeat(_Log(), 3600.0, beat)
    task = asyncio.create_task(supervise(role))
    await asyncio.sleep(0)
    assert beats == 0  # the first record is written at start, not by the role
    role.beat_now()
    await _until(lambda: beats == 1, "the beat asked for")
    role.request_stop()
    await asyncio.wait_for(task, 10)
    assert beats == 1


async def test_a_ticker_hands_each_tick_on_and_says_where_it_moved() -> None:
    fired: list[datetime] = []
    moves: list[tuple[datetime | None, datetime]] = []
    ticker = EntryTicker(
        _Log(),
        parse_cronspec("@every 1s"),
        timedelta(seconds=60),
        fire=fired.append,
        moved=lambda prev, following: moves.append((prev, following)),
    )
    task = asyncio.create_task(supervise(ticker))
    await _until(lambda: len(fired) >= 1, "a tick")
    ticker.request_stop()
    await asyncio.wait_for(task, 10)
    assert moves[0][0] is None and moves[0][1] == fired[0]
    assert moves[1] == (fired[0], fired[0] + timedelta(seconds=1))
