"""A succeeded task shows 100 % progress, written the way docs/events.md shows (issue 41, 4).

``progress(i / n, ...)`` in a loop last reports (n-1)/n: the handler's return is the
last step. The fraction is settled where it is read (Inspector, CLI, web, the
producer's stream), for a completed task only; a failed task keeps what it reached.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from click.testing import CliRunner
from redis.asyncio import Redis

import asyncq
from asyncq import App, Inspector, Server, Task, TaskProgress, TaskState, current_task
from asyncq.cli import main
from asyncq.progress import settled
from tests.support.procs import wait_until

GATE = "progress-settled:go:"
N = 50


def make_app(redis_url: str) -> App:
    app = App(redis_url)

    async def rows(task_id: str | None, n: int, gate: bool) -> int:
        for i in range(n):
            asyncq.progress(i / n, f"rows {i}/{n}")
        if gate:  # held open until the test has seen the last report
            redis = Redis.from_url(redis_url)
            try:
                while not await redis.blpop([GATE + str(task_id)], timeout=1):  # type: ignore[misc]
                    pass
            finally:
                await redis.aclose()
        return n

    @app.task(name="rows:kept", retention=timedelta(hours=1))
    async def rows_kept(n: int, gate: bool = False) -> int:
        return await rows(current_task().id, n, gate)

    async def rows_plain(task: Task) -> None:  # no retention: deleted at success
        await rows(task.id, task.json()["n"], gate=True)

    app.mux.handle("rows:plain", rows_plain)

    @app.task(name="rows:broken", max_retry=0)
    async def rows_broken(n: int) -> None:
        asyncq.progress(0.5, "half way")
        raise RuntimeError("broken on purpose")

    return app


@pytest.fixture
async def app(redis: Redis, redis_url: str) -> AsyncIterator[App]:
    app = make_app(redis_url)
    try:
        yield app
    finally:
        await app.aclose()


async def _follow_to_the_end(app: App, task_name: str) -> list[TaskProgress]:
    """Enqueue a gated run, stream its progress, open the gate once the last report
    streamed, and return every update the stream gave until it ended."""
    if task_name in app.tasks:
        task_id = (await app.tasks[task_name].enqueue(N, gate=True)).id
    else:
        task_id = (await app.client.enqueue(Task.from_json(task_name, {"n": N}))).id
    seen: list[TaskProgress] = []

    async def follow() -> None:
        updates = app.client.progress(task_id, poll_interval=timedelta(milliseconds=200))
        async for update in updates:
            seen.append(update)

    follower = asyncio.create_task(follow())
    last_report = f"rows {N - 1}/{N}"
    await wait_until(lambda: any(u.message == last_report for u in seen), what="the last report")
    assert seen[-1].fraction == (N - 1) / N
    redis = Redis.from_url(str(app.redis))
    try:
        await redis.rpush(GATE + task_id, 1)
    finally:
        await redis.aclose()
    await asyncio.wait_for(follower, 30)  # the stream ends once the task succeeded
    return seen


async def test_the_stream_of_a_succeeded_task_ends_at_100_percent(app: App, worker: Server) -> None:
    seen = await _follow_to_the_end(app, "rows:kept")
    assert seen[-1].percent == 100
    assert seen[-1].message == f"rows {N - 1}/{N}"  # the handler's own words stay
    # Without a retention a succeeded task is deleted, which nothing tells from a
    # deletion (no completion notice either): the stream ends at the last report.
    seen = await _follow_to_the_end(app, "rows:plain")
    assert seen[-1].fraction == (N - 1) / N


async def test_a_succeeded_task_reads_100_percent_and_a_failed_one_what_it_reached(
    app: App, worker: Server, redis_url: str
) -> None:
    done = await app.tasks["rows:kept"].enqueue(N)
    assert await done.result(timeout=30) == N
    broken = await app.tasks["rows:broken"].enqueue(1)
    async with Inspector(redis_url) as insp:

        async def archived() -> bool:
            return (await insp.get_task("default", broken.id)).state is TaskState.ARCHIVED

        await wait_until(archived, what="the failing task archived")
        info = await insp.get_task("default", done.id)
        assert info.state is TaskState.COMPLETED
        assert info.progress is not None
        assert (info.progress.fraction, info.progress.percent) == (1.0, 100)
        assert info.progress.message == f"rows {N - 1}/{N}"
        failed = await insp.get_task("default", broken.id)
        assert failed.progress is not None and failed.progress.fraction == 0.5

    out = await asyncio.to_thread(
        CliRunner().invoke, main, ["-u", redis_url, "task", "inspect", done.id]
    )
    assert out.exit_code == 0, out.output
    assert f"100% rows {N - 1}/{N}" in out.stdout


def test_settled_changes_only_a_completed_task() -> None:
    p = TaskProgress.of(0.98, "rows 49/50", 1_700_000_000.0)
    assert settled(p, TaskState.COMPLETED) == TaskProgress.of(1.0, "rows 49/50", 1_700_000_000.0)
    for state in (TaskState.ACTIVE, TaskState.RETRY, TaskState.ARCHIVED, None):
        assert settled(p, state) is p
    assert settled(None, TaskState.COMPLETED) is None
