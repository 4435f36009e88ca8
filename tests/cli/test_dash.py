"""``asyncq dash`` driven headlessly with textual's pilot, on Go-written Redis states."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from asyncq.cli.dash import DashApp, HelpScreen, QueueScreen, QueuesScreen, TaskScreen
from asyncq.task import TaskState
from tests.support import gofixtures as go
from tests.support.gofixtures import GoTask
from tests.support.redis_server import free_port

NOW = datetime.now(UTC).replace(microsecond=0)
SIZE = (160, 40)


async def until(pilot: Pilot[None], cond: Callable[[], bool], what: str) -> None:
    for _ in range(400):
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def rows(app: DashApp, table_id: str) -> list[str]:
    table = app.screen.query_one(table_id, DataTable)
    return [str(k.value) for k in table.rows]


async def test_navigate_to_a_task_and_archive_it(redis_url: str, redis: Redis) -> None:
    other, target = GoTask("email:welcome", b'{"user": 1}'), GoTask("email:welcome", b"two")
    await go.enqueue(redis, other, NOW - timedelta(seconds=5))
    await go.enqueue(redis, target, NOW)
    await go.seed_archived(redis, GoTask("old"), NOW - timedelta(hours=1))
    await go.register_queue(redis, "critical")

    app = DashApp(redis_url, refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, QueuesScreen), "the queues screen")
        await until(pilot, lambda: rows(app, "#queues") == ["critical", "default"], "queues")
        await pilot.press("down", "enter")  # the second queue: default
        await until(pilot, lambda: isinstance(app.screen, QueueScreen), "the queue screen")
        screen = app.screen
        assert isinstance(screen, QueueScreen)
        assert screen.queue == "default" and screen.state is TaskState.PENDING
        await until(pilot, lambda: rows(app, "#tasks") == [other.id, target.id], "tasks")
        await pilot.press("down", "enter")  # the second pending task
        await until(pilot, lambda: isinstance(app.screen, TaskScreen), "the task screen")
        details = app.screen.query_one("#details", Static)
        await until(pilot, lambda: target.id in str(details.render()), "task details")
        assert "State:" in str(details.render()) and "pending" in str(details.render())

        await pilot.press("a")
        await until(
            pilot, lambda: "archived" in str(details.render()), "the task to show as archived"
        )
        assert await redis.hget(target.key, "state") == b"archived"
        assert await redis.zscore("asynq:{default}:archived", target.id) is not None
        assert await redis.lrange("asynq:{default}:pending", 0, -1) == [other.id.encode()]

        # Back on the queue screen the pending tab shows the other task only.
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, QueueScreen), "the queue screen")
        await until(pilot, lambda: rows(app, "#tasks") == [other.id], "the refreshed list")
        # The archived tab lists both archived tasks.
        await pilot.press("right", "right", "right", "right")
        await until(pilot, lambda: len(rows(app, "#tasks")) == 2, "the archived tab")
        assert app.screen.state is TaskState.ARCHIVED  # type: ignore[attr-defined]
        assert target.id in rows(app, "#tasks")
        # Run it again from the list: back to pending.
        table = app.screen.query_one("#tasks", DataTable)
        table.move_cursor(row=rows(app, "#tasks").index(target.id))
        await pilot.press("r")
        await until(pilot, lambda: len(rows(app, "#tasks")) == 1, "the archived list to shrink")
        assert await redis.hget(target.key, "state") == b"pending"
        await pilot.press("q", "q")
    assert app.return_code == 0


async def test_pause_resume_and_delete_with_confirmation(redis_url: str, redis: Redis) -> None:
    t = GoTask("report", b"x")
    await go.schedule(redis, t, NOW + timedelta(hours=1))
    app = DashApp(redis_url, refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, QueuesScreen), "the queues screen")
        await until(pilot, lambda: rows(app, "#queues") == ["default"], "queues")
        await pilot.press("p")
        await until(pilot, lambda: app.screen.infos["default"].paused, "pause")  # type: ignore[attr-defined]
        assert await redis.exists("asynq:{default}:paused")
        await pilot.press("p")
        await until(pilot, lambda: not app.screen.infos["default"].paused, "resume")  # type: ignore[attr-defined]
        assert not await redis.exists("asynq:{default}:paused")

        # A queue that holds tasks is not removed: the error is a notification.
        await pilot.press("d", "y")
        await pilot.pause(0.2)
        assert await redis.sismember("asynq:queues", "default")

        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, QueueScreen), "the queue screen")
        assert app.screen.state is TaskState.SCHEDULED  # type: ignore[attr-defined]
        await until(pilot, lambda: rows(app, "#tasks") == [t.id], "the scheduled task")
        await pilot.press("d", "n")  # declined
        await pilot.pause(0.2)
        assert await redis.exists(t.key)
        await pilot.press("d", "y")
        await until(pilot, lambda: rows(app, "#tasks") == [], "the task to disappear")
        assert not await redis.exists(t.key)

        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, QueueScreen), "help to close")
        await pilot.press("escape", "escape")
    assert app.return_code == 0


async def test_aggregating_groups_and_paging(redis_url: str, redis: Redis) -> None:
    for i in range(25):
        await go.add_to_group(redis, GoTask("g", b"%d" % i, group_key="a"), NOW + timedelta(i))
    await go.add_to_group(redis, GoTask("g", b"b", group_key="b"), NOW)
    app = DashApp(redis_url, refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, QueuesScreen), "the queues screen")
        await until(pilot, lambda: rows(app, "#queues") == ["default"], "queues")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, QueueScreen), "the queue screen")
        screen = app.screen
        assert isinstance(screen, QueueScreen) and screen.state is TaskState.AGGREGATING
        await until(pilot, lambda: len(rows(app, "#tasks")) == 20, "the first page")
        assert screen.group == "a"
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: len(rows(app, "#tasks")) == 5, "the second page")
        assert screen.page == 2
        await pilot.press("g")
        await until(pilot, lambda: len(rows(app, "#tasks")) == 1, "group b")
        assert screen.group == "b" and screen.page == 1


@pytest.mark.parametrize("uri", ["redis://127.0.0.1:{port}/0", "bogus://x"])
async def test_unreachable_redis_ends_the_app_with_a_reason(uri: str) -> None:
    app = DashApp(uri.format(port=free_port()), refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.fatal_error is not None, "the start-up error")
    assert app.fatal_error is not None and "cannot start the dashboard" in app.fatal_error


def test_refresh_must_be_positive() -> None:
    with pytest.raises(ValueError, match="refresh must be at least"):
        DashApp("redis://127.0.0.1:6379/0", refresh=0)


async def test_type_rates_and_queue_rate_are_shown(redis_url: str, redis: Redis) -> None:
    from tests.support import webdata

    await webdata.seed(redis)
    await webdata.seed_flow(redis)  # type rates, and a rate and the ordered flag on critical
    app = DashApp(redis_url, refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, QueuesScreen), "the queues screen")
        line = app.screen.query_one("#type-rates", Static)
        await until(pilot, lambda: "Type rates:" in str(line.render()), "the type rates")
        text = " ".join(str(line.render()).split())
        assert "api:partner 60/h (tokens 0, next in " in text and "put back 2)" in text
        assert "mail 100/s (no bucket yet, put back 0)" in text
        await until(pilot, lambda: rows(app, "#queues")[:1] == ["critical"], "queues")
        await pilot.press("enter")  # critical
        await until(pilot, lambda: isinstance(app.screen, QueueScreen), "the queue screen")
        summary = app.screen.query_one("#summary", Static)
        await until(pilot, lambda: "rate 50/s" in str(summary.render()), "the queue's rate")
        assert "(tokens 50)" in str(summary.render()) and "ordered" in str(summary.render())


async def test_no_type_rates_line_without_any(redis_url: str, redis: Redis) -> None:
    await go.register_queue(redis, "default")
    app = DashApp(redis_url, refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: rows(app, "#queues") == ["default"], "queues")
        status = app.screen.query_one("#status", Static)
        await until(pilot, lambda: "updated" in str(status.render()), "a full load")
        assert str(app.screen.query_one("#type-rates", Static).render()).strip() == ""
