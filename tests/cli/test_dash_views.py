"""``asyncq dash``'s servers and schedulers views, driven with textual's pilot."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from asyncq.cli.dash import DashApp, QueuesScreen, SchedulersScreen, ServersScreen
from tests.support import gofixtures as go
from tests.support.gofixtures import GoTask, GoWorker

SIZE = (180, 45)
ENTRY = "7d3c9a6e-2b1f-4e8a-9f5d-0c1b2a3d4e5f"


async def until(pilot: Pilot[None], cond: Callable[[], bool], what: str) -> None:
    for _ in range(400):
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def cells(app: DashApp, table_id: str) -> list[list[str]]:
    table = app.screen.query_one(table_id, DataTable)
    return [[str(c) for c in table.get_row(k)] for k in table.rows]


async def test_servers_view_lists_servers_and_running_tasks(redis_url: str, redis: Redis) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    slow = GoTask("report:build", b'{"id": 7}', queue="critical")
    fast = GoTask("email:send", b'{"to": "a@example.com"}')
    await go.register_queue(redis, "critical")
    sid = await go.seed_server(
        redis,
        now=now,
        host="worker-1",
        pid=3120,
        concurrency=20,
        queues={"critical": 6, "default": 3},
        workers=[
            GoWorker(slow, now - timedelta(minutes=5), now + timedelta(minutes=25)),
            GoWorker(fast, now - timedelta(seconds=3), now + timedelta(minutes=30)),
        ],
        ttl=600,
    )
    await go.seed_server(redis, now=now, host="worker-2", pid=77, concurrency=4, ttl=600)

    app = DashApp(redis_url, refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, QueuesScreen), "the queues screen")
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ServersScreen), "the servers screen")
        await until(pilot, lambda: len(cells(app, "#servers")) == 2, "two servers")
        first, second = cells(app, "#servers")
        assert first[:2] == ["worker-1:3120", "active"]
        assert first[3:6] == ["2/20", "critical:6, default:3", sid]
        assert second[0] == "worker-2:77" and second[3] == "0/4"
        running = cells(app, "#workers")
        assert [r[:3] for r in running] == [
            [slow.id, "report:build", "critical"],
            [fast.id, "email:send", "default"],
        ]
        assert (
            running[0][3].startswith("5m")
            and running[0][3].endswith(" ago")
            and running[0][5] == "worker-1:3120"
        )
        assert '{"id": 7}' in running[0][6]
        summary = str(app.screen.query_one("#summary", Static).render())
        assert "Servers (2)" in summary and "running 2 of 24 worker slots" in summary
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, QueuesScreen), "back to the queues")


async def test_schedulers_view_and_entry_history(redis_url: str, redis: Redis) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    entry = go.encode_scheduler_entry(
        entry_id=ENTRY,
        spec="@every 1h",
        task_type="report:daily",
        payload=b'{"kind": "daily"}',
        options=['Queue("low")', "MaxRetry(3)"],
        next_at=now + timedelta(minutes=47),
        prev_at=now - timedelta(minutes=13),
    )
    await go.seed_scheduler(redis, "sched-1:99:abc", [entry], now, ttl=600)
    events = [f"task-{i}" for i in range(3)]
    for i, tid in enumerate(events):
        await go.seed_enqueue_event(redis, ENTRY, tid, now - timedelta(hours=i))
    await go.register_queue(redis, "low")

    app = DashApp(redis_url, refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, QueuesScreen), "the queues screen")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, SchedulersScreen), "schedulers")
        await until(pilot, lambda: len(cells(app, "#entries")) == 1, "the entry")
        row = cells(app, "#entries")[0]
        assert row[:2] == ["@every 1h", "report:daily"]
        assert '{"kind": "daily"}' in row[2]
        assert row[3] == 'Queue("low"), MaxRetry(3)'
        assert row[4].startswith("in 4") and row[6] == ENTRY
        assert row[5].startswith("13m") and row[5].endswith(" ago")
        assert cells(app, "#history") == []
        await pilot.press("enter")
        await until(pilot, lambda: len(cells(app, "#history")) == 3, "the entry's history")
        assert [r[1] for r in cells(app, "#history")] == events  # newest first
        title = str(app.screen.query_one("#history-title", Static).render())
        assert ENTRY in title and "3 shown" in title
