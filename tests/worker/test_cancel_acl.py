"""Cancellation for a Redis user granted only the ``&asynq:cancel`` channel (wake-ups
degrade to polling)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import pytest
import structlog
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._inspection.inspector import Inspector
from asyncq._producer.client import Client
from asyncq._worker.server import Server
from asyncq.mux import ServeMux
from asyncq.task import Task
from tests.support.acl import temporary_acl_user
from tests.support.procs import fast, stored_message, task_hash, wait_until

Q = "default"


# -- 4. a Redis user allowed only the cancel channel -------------------------------------------


@pytest.fixture
async def cancel_only_user(redis: Redis, redis_url: str) -> AsyncIterator[str]:
    """URL of an ACL user that may use every key and command but only the ``asynq:cancel``
    channel: everything Go asynq needs."""
    async with temporary_acl_user(
        redis, redis_url, "followup", "~*", "resetchannels", "&asynq:cancel", "+@all"
    ) as url:
        yield url


@pytest.fixture
def structlog_configured() -> Iterator[None]:
    """asyncq's loggers follow structlog's configuration (which ``capture_logs`` swaps)
    only once the application configured structlog; unconfigured, asyncq uses its own
    safe processors, which ``capture_logs`` cannot see. Whether an earlier test in this
    process configured it must not decide what this test reads."""
    was_configured = structlog.is_configured()
    structlog.configure()
    yield
    if not was_configured:
        structlog.reset_defaults()


@pytest.mark.usefixtures("structlog_configured")
async def test_cancel_works_for_a_user_without_wakeup_channel_rights(
    redis: Redis, client: Client, cancel_only_user: str
) -> None:
    started = asyncio.Event()
    done: list[str] = []

    async def long(task: Task) -> None:
        started.set()
        await asyncio.sleep(3600)

    async def quick(task: Task) -> None:
        done.append(task.id or "")

    mux = ServeMux()
    mux.handle("long", long)
    mux.handle("quick", quick)
    server = Server(
        cancel_only_user,
        concurrency=2,
        **fast(task_check=timedelta(milliseconds=50)),
        retry_delay=lambda n, e, t: timedelta(hours=1),
    )
    with structlog.testing.capture_logs() as logs:
        await server.start(mux)
        try:
            # Polling still finds work although no wake-up can arrive.
            info = await client.enqueue(Task("quick"))
            await wait_until(lambda: done == [info.id], what="quick task processed")
            long_info = await client.enqueue(Task("long"))
            await asyncio.wait_for(started.wait(), 10)
            async with Inspector(cancel_only_user) as insp:
                await insp.cancel(long_info.id)

            async def retried() -> bool:
                h = await task_hash(redis, Q, long_info.id)
                return h.get(b"state") == b"retry"

            await wait_until(retried, what="cancelled task moved to retry")
            assert (await stored_message(redis, Q, long_info.id)).error_msg == "context canceled"
            # Cancellation through a plain PUBLISH, by the admin, works the same way.
            started.clear()
            again = await client.enqueue(Task("long"))
            await asyncio.wait_for(started.wait(), 10)
            await redis.publish(keys.CANCEL_CHANNEL, again.id)

            async def again_retried() -> bool:
                return (await task_hash(redis, Q, again.id)).get(b"state") == b"retry"

            await wait_until(again_retried, what="second cancelled task moved to retry")
        finally:
            await server.shutdown()
    assert server.stats.role_restarts["subscriber"] == 0
    denied = [e for e in logs if "wake-up" in e["event"] and e["log_level"] == "warning"]
    assert len(denied) == 1, denied
    reconnects = [e for e in logs if "reconnecting" in e["event"]]
    assert reconnects == []
