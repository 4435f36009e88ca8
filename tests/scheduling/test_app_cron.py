"""``@app.cron``: schedules in code, run by the App's workers, each tick enqueued once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest
from click.testing import CliRunner
from redis.asyncio import Redis

from asyncq import App, Inspector, Intervals, TaskArgumentError
from asyncq._keys import ALL_SCHEDULERS
from asyncq.cli import main
from asyncq.proto.asynq import SchedulerEntry
from asyncq.web import create_app
from tests.support.procs import stop_process, wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_cron_forms_are_checked_when_declared() -> None:
    app = App("redis://localhost:6379/0")

    @app.cron("*/5 * * * *", timezone="Europe/Paris", kwargs={"days": 30})
    @app.task(name="maint:cleanup", queue="maintenance")
    async def cleanup(days: int) -> int:
        return days

    @app.cron(every=timedelta(minutes=10), jitter=timedelta(seconds=30))
    async def refresh() -> None: ...

    @app.cron("@daily", timezone=ZoneInfo("America/New_York"), args=(7,))
    @app.cron("0 3 * * *", args=(90,))
    @app.task(name="maint:purge")
    async def purge(days: int) -> None: ...

    assert [(c.spec, c.task.name, c.call.payload, c.jitter) for c in app.crons] == [
        ("CRON_TZ=Europe/Paris */5 * * * *", "maint:cleanup", b'{"days":30}', None),
        ("@every 10m0s", refresh.name, b"{}", timedelta(seconds=30)),
        ("0 3 * * *", "maint:purge", b'{"days":90}', None),
        ("CRON_TZ=America/New_York @daily", "maint:purge", b'{"days":7}', None),
    ]
    assert app.crons[0].call.options["queue"] == "maintenance"
    assert refresh.name in app.tasks  # a plain function became a task
    with pytest.raises(TaskArgumentError, match="days"):
        app.cron("@hourly", kwargs={"days": "thirty"})(cleanup)
    with pytest.raises(TypeError, match="missing"):
        app.cron("@hourly")(cleanup)
    with pytest.raises(ValueError, match="invalid cron spec"):
        app.cron("*/5 * * *")
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        app.cron("@hourly", timezone="Mars/Olympus")
    with pytest.raises(TypeError, match="a cron spec or every"):
        app.cron("@hourly", every=timedelta(hours=1))
    with pytest.raises(TypeError, match="a cron spec or every"):
        app.cron()
    with pytest.raises(ValueError, match="whole number of seconds"):
        app.cron(every=timedelta(milliseconds=1500))
    with pytest.raises(ValueError, match="jitter must be positive"):
        app.cron("@hourly", jitter=timedelta(0))
    with pytest.raises(ValueError, match="names its zone"):
        app.cron("CRON_TZ=UTC @hourly", timezone="Europe/Paris")
    other = App("redis://localhost:6379/0")
    with pytest.raises(ValueError, match="another App"):
        other.cron("@hourly")(refresh)


async def test_a_burst_worker_does_not_run_the_schedules(redis_url: str, redis: Redis) -> None:
    app = App(redis_url)

    @app.cron(every=timedelta(seconds=1))
    async def tick() -> None: ...

    await app.run_worker(burst=True, intervals=Intervals(task_check=timedelta(milliseconds=50)))
    assert await redis.zcard(ALL_SCHEDULERS) == 0


TASKS = """
import os
from datetime import timedelta
from redis.asyncio import Redis
from asyncq import App, current_task

app = App(os.environ["TEST_REDIS_URL"])


@app.cron(every=timedelta(seconds=1), kwargs={"tag": "tick"})
@app.task(name="maint:tick", queue="maintenance")
async def tick(tag: str) -> str:
    async with Redis.from_url(os.environ["TEST_REDIS_URL"]) as r:
        await r.rpush("ran", current_task().id or "")
    return tag
"""


@pytest.fixture
async def http(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    web = create_app(redis_url)
    async with (
        web.router.lifespan_context(web),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=web), base_url="http://t") as h,
    ):
        yield h


def _worker(cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``asyncq worker tasks:app``, its log in *log* (a file: nothing to drain)."""
    with log.open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "asyncq.cli", "worker", "tasks:app"],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


async def _entries_in_redis(redis: Redis) -> list[SchedulerEntry]:
    """Every scheduler entry as Go's ``asynq cron ls`` reads them (asynq:schedulers)."""
    out = []
    for key in await redis.zrange(ALL_SCHEDULERS, 0, -1):
        out += [SchedulerEntry.parse(raw) for raw in await redis.lrange(key, 0, -1)]
    return out


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(180)
async def test_two_workers_enqueue_each_tick_once_and_list_it_once(
    redis_url: str, redis: Redis, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    (tmp_path / "tasks.py").write_text(TASKS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_REDIS_URL": redis_url}
    env.pop("ASYNCQ_REDIS_URL", None)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [_worker(tmp_path, env, log) for log in logs]
    try:

        async def ran_enough() -> bool:
            return await redis.llen("ran") >= 5

        await wait_until(ran_enough, within=60, interval=0.1, what="five ticks run")
        # Listed once: in asyncq's Inspector, in Redis as Go's `asynq cron ls` reads it,
        # in `asyncq cron ls` and in the web API.
        async with Inspector(redis) as insp:
            entries = await insp.scheduler_entries()
        assert [(e.spec, e.task_type) for e in entries] == [("@every 1s", "maint:tick")]
        entry_id = entries[0].id
        raw = await _entries_in_redis(redis)
        assert [(e.id, e.spec, e.task_type) for e in raw] == [(entry_id, "@every 1s", "maint:tick")]
        assert 'Queue("maintenance")' in raw[0].enqueue_options  # Go's option strings
        res = await asyncio.to_thread(CliRunner().invoke, main, ["-u", redis_url, "cron", "ls"])
        assert res.exit_code == 0, res.output
        assert res.output.count(entry_id) == 1, res.output
        listed = (await http.get("/api/schedulers")).json()["entries"]
        assert [e["id"] for e in listed] == [entry_id]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        for proc in procs:
            stop_process(proc)
    ran = [x.decode() for x in await redis.lrange("ran", 0, -1)]
    assert len(ran) == len(set(ran))  # no tick ran twice
    # One history, kept after both workers stopped, one event per enqueue: the two
    # workers together logged exactly as many enqueues as there are events.
    async with Inspector(redis) as insp:
        events = await insp.scheduler_enqueue_events(entry_id, size=1000)
    event_ids = [e.task_id for e in events]
    assert len(event_ids) == len(set(event_ids)) >= len(ran)
    assert set(ran) <= set(event_ids)
    enqueued = sum(log.read_text().count("enqueued periodic task") for log in logs)
    assert enqueued == len(event_ids)
    res = await asyncio.to_thread(
        CliRunner().invoke, main, ["-u", redis_url, "cron", "history", entry_id]
    )
    assert res.exit_code == 0 and "No enqueue events" not in res.output, res.output
