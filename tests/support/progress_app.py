"""Handlers that report progress and write events (imported by a worker subprocess too).

``asyncq worker tests.support.progress_app:app`` serves the typed task ``crunch`` and,
through ``tests.support.progress_app:mux``, the plain handler ``steps``. Both report
``n`` steps, then wait for the key ``progress-test:go:<id>`` before the last
one (a list the test pushes to), so a test can look at a task that is still running.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

from redis.asyncio import Redis

import asyncq
from asyncq import App, Task, current_task

URL_ENV = "PROGRESS_APP_REDIS"
GATE = "progress-test:go:"

app = App(os.environ.get(URL_ENV, "redis://127.0.0.1:1/0"), events=True)


async def _gate(task_id: str) -> None:
    redis = Redis.from_url(str(app.redis))
    try:
        while not await redis.blpop([GATE + task_id], timeout=1):  # type: ignore[misc]
            pass
    finally:
        await redis.aclose()


async def _steps(task_id: str, n: int, hold: bool) -> int:
    for i in range(n):
        asyncq.progress(i / n, f"step {i}/{n}")
        await asyncio.sleep(0.03)
    if hold:
        await _gate(task_id)
    asyncq.progress(1.0, "done")
    return n


@app.task(retention=timedelta(hours=1))
async def crunch(n: int, hold: bool = False) -> int:
    task_id = current_task().id
    assert task_id is not None
    return await _steps(task_id, n, hold)


@app.task(retention=timedelta(hours=1))
async def quiet(n: int) -> int:
    return n


async def steps(task: Task) -> None:
    data = task.json()
    assert task.id is not None
    await _steps(task.id, data["n"], data.get("hold", False))


async def failing(task: Task) -> None:
    raise RuntimeError("broken on purpose")


app.mux.handle("steps", steps)
app.mux.handle("failing", failing)
