"""Cancelling a task for good (issue 41, item 10): ``cancel`` still retries by default
(asynq's), ``cancel(id, retry=False)`` archives it, in the API, the CLI and the web UI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from redis.asyncio import Redis

from asyncq import (
    Inspector,
    ServeMux,
    Server,
    Task,
    TaskCanceledError,
    TaskState,
    TaskStoppedError,
    chain,
)
from asyncq import _keys as keys
from asyncq._producer.client import Client
from asyncq.web import create_app
from tests.support.procs import FAST, ROOT, wait_until

H = {"X-Asyncq-Request": "1"}
HOUR = timedelta(hours=1)


class Worker:
    """A server whose ``block`` handler runs until cancelled, recording what it saw."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.seen: list[BaseException] = []

    async def block(self, task: Task) -> None:
        self.started.append(task.id or "")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError as exc:
            self.seen.append(exc)
            raise


@pytest.fixture
async def worker(redis: Redis) -> AsyncIterator[Worker]:
    w = Worker()
    mux = ServeMux()
    mux.handle("block", w.block)
    mux.handle("next", lambda task: asyncio.sleep(0))
    # Retries wait an hour: a retried task stays in the retry set for the test to see.
    server = Server(redis, retry_delay=lambda n, exc, task: HOUR, **FAST)
    await server.start(mux)
    try:
        yield w
    finally:
        await server.shutdown()


async def _running(redis: Redis, worker: Worker, client: Client) -> str:
    info = await client.enqueue(Task("block"), max_retry=5)
    await wait_until(lambda: info.id in worker.started, what="the handler started")
    return info.id


async def _state(insp: Inspector, task_id: str, state: TaskState) -> bool:
    return (await insp.get_task("default", task_id)).state is state


async def test_cancel_retries_and_cancel_without_retry_archives(
    redis: Redis, worker: Worker
) -> None:
    async with Client(redis) as client, Inspector(redis) as insp:
        retried = await _running(redis, worker, client)
        await insp.cancel(retried)  # asynq's: a failure, retried
        await wait_until(lambda: _state(insp, retried, TaskState.RETRY), what="retried")
        info = await insp.get_task("default", retried)
        assert info.last_error == "context canceled" and info.retried == 1

        stopped = await _running(redis, worker, client)
        await insp.cancel(stopped, retry=False)
        await wait_until(lambda: _state(insp, stopped, TaskState.ARCHIVED), what="archived")
        info = await insp.get_task("default", stopped)
        assert info.last_error == "context canceled: stopped, not retried"
        assert info.retried == 0  # archived at once, with retries left
    assert isinstance(TaskStoppedError(), TaskCanceledError)  # handlers catching it see one


async def test_cancel_without_retry_fails_the_workflow(redis: Redis, worker: Worker) -> None:
    async with Client(redis) as client, Inspector(redis) as insp:
        handle = await chain(Task("block", max_retry=5), Task("next", retention=HOUR)).enqueue(
            client
        )
        first = handle.stages[0][0].id
        await wait_until(lambda: first in worker.started, what="the first step started")
        await insp.cancel(first, retry=False)

        async def failed() -> bool:
            return (await handle.status()).state == "failed"

        await wait_until(failed, what="the workflow failed")
        status = await handle.status()
        assert [[s.state for s in stage] for stage in status.stages] == [["failed"], ["waiting"]]


async def test_bad_retry_argument_is_refused(redis: Redis) -> None:
    async with Inspector(redis) as insp:
        with pytest.raises(TypeError, match="retry must be True or False"):
            await insp.cancel("some-id", retry="no")  # type: ignore[arg-type]


async def test_go_servers_still_get_a_plain_cancel(redis: Redis) -> None:
    # A Go asynq server only knows the plain ID: it follows the marked message.
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.CANCEL_CHANNEL)
    await pubsub.get_message(timeout=1)
    async with Inspector(redis) as insp:
        await insp.cancel("task-1", retry=False)
    got = []
    for _ in range(2):
        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2)
        assert msg is not None
        got.append(msg["data"])
    await pubsub.aclose()
    assert got == [b"{asyncq:stop}task-1", b"task-1"]


async def test_web_stop_archives_and_the_active_tab_offers_it(
    redis: Redis, redis_url: str, worker: Worker
) -> None:
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
        Client(redis) as client,
        Inspector(redis) as insp,
    ):
        task_id = await _running(redis, worker, client)
        page = (await http.get("/queues/default?state=active")).text
        assert f"tasks/{task_id}/stop" in page and "archived, not retried" in page
        resp = await http.post(f"/api/queues/default/tasks/{task_id}/stop", headers=H)
        assert resp.status_code == 200, resp.text
        await wait_until(lambda: _state(insp, task_id, TaskState.ARCHIVED), what="archived")
        refused = await http.post(f"/api/queues/default/tasks/{task_id}/stop", headers=H)
        assert refused.status_code == 409 and "only active tasks" in refused.text


async def test_cli_cancel_no_retry(redis: Redis, redis_url: str, worker: Worker) -> None:
    async with Client(redis) as client, Inspector(redis) as insp:
        task_id = await _running(redis, worker, client)
        proc = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "asyncq.cli",
                "-u",
                redis_url,
                "task",
                "cancel",
                "--no-retry",
                task_id,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "NO_COLOR": "1"},
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"Sent cancelation (no retry) signal for task {task_id}"
        await wait_until(lambda: _state(insp, task_id, TaskState.ARCHIVED), what="archived")
