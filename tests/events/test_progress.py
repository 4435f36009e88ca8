"""Task progress: reported by handlers, stored asyncq-only, streamed to producers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

import asyncq
from asyncq import Client, Inspector, Server, Task, TaskProgress, TaskState
from asyncq import _keys as keys
from asyncq.progress import KEEP_AFTER_FAILURE, progress_key
from tests.support import progress_app as pa
from tests.support.gofixtures import GoTask
from tests.support.helpers import pexpiretime
from tests.support.procs import FAST, ROOT, wait_until

READY = b"send signal TERM or INT"


@pytest.fixture
async def app(redis: Redis, redis_url: str) -> AsyncIterator[Any]:
    pa.app.redis = redis_url
    try:
        yield pa.app
    finally:
        await pa.app.aclose()


async def _progress(insp: Inspector, task_id: str) -> TaskProgress | None:
    return (await insp.get_task("default", task_id)).progress


async def test_plain_handler_progress_is_stored_and_shown_in_task_info(
    worker: Server, redis: Redis, redis_url: str
) -> None:
    async with Client(redis_url) as client, Inspector(redis_url) as insp:
        info = await client.enqueue(Task.from_json("steps", {"n": 4, "hold": True}))

        async def last_step() -> bool:
            p = await _progress(insp, info.id)
            return p is not None and p.message == "step 3/4"

        await wait_until(last_step, what="the last step's progress")
        p = await _progress(insp, info.id)
        assert p is not None and p.fraction == 0.75 and p.percent == 75
        active = await insp.list_active("default")
        assert [a.progress for a in active if a.id == info.id] == [p]
        # Stored beside the task, not in it: the task hash keeps only asynq's fields.
        fields = await redis.hkeys(keys.task_key("default", info.id))
        assert b"progress" not in fields
        ttl = await redis.pttl(progress_key("default", info.id))
        assert 0 < ttl <= (KEEP_AFTER_FAILURE + timedelta(minutes=31)).total_seconds() * 1000
        await redis.rpush(pa.GATE + info.id, 1)
        # No retention: asynq deletes the task hash at success, and the progress goes with it.
        await wait_until(
            lambda: _gone(redis, progress_key("default", info.id)), what="progress deleted"
        )


async def _gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


async def test_typed_handler_progress_streams_to_the_handle_and_expires_with_the_task(
    app: Any, worker: Server, redis: Redis, redis_url: str
) -> None:
    handle = await pa.crunch.enqueue(5, hold=True)
    seen: list[TaskProgress] = []

    async def follow() -> None:
        async for update in handle.progress():
            seen.append(update)

    follower = asyncio.create_task(follow())
    await wait_until(lambda: any(u.message == "step 4/5" for u in seen), what="streamed steps")
    await redis.rpush(pa.GATE + handle.id, 1)
    assert await handle.result(timeout=30) == 5
    await asyncio.wait_for(follower, 30)  # the stream ends once the task completed
    assert seen[-1].fraction == 1.0 and seen[-1].message == "done"
    fractions = [u.fraction for u in seen]
    assert fractions == sorted(fractions)
    # Expires with the completed task (retention 1 h: the janitor deletes it then), to the second.
    expires = await redis.zscore(keys.completed_key("default"), handle.id)
    progress_expires = await pexpiretime(redis, progress_key("default", handle.id))
    assert expires is not None and abs(expires * 1000 - progress_expires) < 5_000
    async with Inspector(redis_url) as insp:
        done = await insp.get_task("default", handle.id)
        assert done.state is TaskState.COMPLETED
        assert done.progress is not None and done.progress.message == "done"
        await insp.delete_task("default", handle.id)
    assert not await redis.exists(progress_key("default", handle.id))


async def test_tight_loop_is_rate_limited(app: Any, redis_url: str, redis: Redis) -> None:
    writes: list[str] = []

    async def busy(task: Task) -> None:
        for i in range(20_000):
            asyncq.progress(i / 20_000, f"{i}")
            if i % 500 == 0:
                await asyncio.sleep(0)
        asyncq.progress(1.0, "last")

    mux = asyncq.ServeMux()
    mux.handle("busy", busy)
    server = Server(redis_url, **FAST)
    pubsub = redis.pubsub()
    await pubsub.subscribe("asyncq:progress:{default}")
    await server.start(mux)
    try:
        async with Client(redis_url) as client:
            info = await client.enqueue(Task("busy"), retention=timedelta(minutes=5))
            await client.wait(info.id, timeout=30)

        async def got_last() -> bool:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message is not None:
                writes.append(json.loads(message["data"])["message"])
            return bool(writes) and writes[-1] == "last"

        await wait_until(got_last, what="the last update")
    finally:
        await server.shutdown()
        await pubsub.aclose()
    # 20,000 reports became a handful of writes (at most one per 100 ms) and the last.
    assert len(writes) < 200
    stored = await redis.hget(progress_key("default", info.id), "message")
    assert stored == b"last"


def test_progress_outside_a_handler_and_bad_values() -> None:
    with pytest.raises(RuntimeError, match="inside a task handler"):
        asyncq.progress(0.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        asyncq.progress(1.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        asyncq.progress(float("nan"))
    with pytest.raises(TypeError, match="must be a number"):
        asyncq.progress(True)
    with pytest.raises(TypeError, match="message must be a str"):
        asyncq.progress(0.1, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most"):
        asyncq.progress(0.1, "x" * 5000)


@pytest.mark.subprocess
async def test_progress_across_processes_leaves_go_bytes_unchanged(
    app: Any, redis: Redis, redis_url: str
) -> None:
    """A worker subprocess reports; this process streams it; Go's decoder reads the task."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), pa.URL_ENV: redis_url}
    env.pop("ASYNCQ_REDIS_URL", None)
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "asyncq.cli", "-u", redis_url, "worker",
          "tests.support.progress_app:app", "-q", "default", "-c", "4"],
        env=env, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(60):
            while READY not in await proc.stderr.readline():
                pass
        async with Client(redis_url) as client:
            quiet = await pa.quiet.enqueue(3)
            assert await quiet.result(timeout=30) == 3
            handle = await pa.crunch.enqueue(3, hold=True)
            updates: list[TaskProgress] = []

            async def follow() -> None:
                async for update in client.progress(handle.id):
                    updates.append(update)

            follower = asyncio.create_task(follow())
            await wait_until(
                lambda: any(u.message == "step 2/3" for u in updates),
                what="updates from the worker process",
            )
            await redis.rpush(pa.GATE + handle.id, 1)
            await handle.result(timeout=30)
            await asyncio.wait_for(follower, 30)
        assert [u.message for u in updates][-1] == "done"
        # Go asynq's view: the same hash fields as a task that reported nothing, and the
        # message decodes with the independent Go-format decoder.
        h = await redis.hgetall(keys.task_key("default", handle.id))
        q = await redis.hgetall(keys.task_key("default", quiet.id))
        assert set(h) == set(q)
        decoded = GoTask.decode(h[b"msg"])
        assert decoded.id == handle.id and decoded.type == "tests.support.progress_app.crunch"
        asynq_keys = {k for k in await redis.keys("asynq:*") if b"progress" in k}
        assert asynq_keys == set()
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()


def test_cli_and_dash_show_progress() -> None:
    from datetime import UTC, datetime

    from asyncq.cli._format import task_rows, task_text
    from asyncq.task import TaskInfo

    now = datetime.now(UTC)
    info = TaskInfo(
        id="t1", queue="default", type="import", payload=b"", state=TaskState.ACTIVE,
        max_retry=3, retried=0, last_error="", last_failed_at=None, timeout=None,
        deadline=None, group="", next_process_at=None, retention=None, completed_at=None,
        result=None, progress=TaskProgress(0.4, "rows 400/1000", now),
    )  # fmt: skip
    headers, rows = task_rows(TaskState.ACTIVE, [info], now)
    assert rows[0][headers.index("Progress")] == "40% rows 400/1000"
    assert "Progress:" in task_text(info) and "40% rows 400/1000" in task_text(info)
