"""Role supervision: a crashing role is logged and restarted with backoff; Redis errors
are logged at a bounded rate; the helpers behind both."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
import structlog
from redis.asyncio import Redis

from asyncq._broker.multiqueue import MultiQueue
from asyncq._logging import Backoff, RateLimiter
from asyncq._producer.client import Client
from asyncq._worker.lease import Lease
from asyncq._worker.server import Server
from asyncq.mux import ServeMux
from asyncq.task import Task
from tests.support.procs import FAST, wait_until
from tests.support.redis_server import free_port


async def test_crashing_role_is_logged_and_restarted(
    redis: Redis, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = asyncio.Event()

    async def handle(task: Task) -> None:
        done.set()

    mux = ServeMux()
    mux.handle("later", handle)
    with structlog.testing.capture_logs() as logs:
        server = Server(redis, **FAST)
        real = MultiQueue.forward_due
        calls = 0

        async def flaky(self: MultiQueue, qnames: Any) -> tuple[int, float | None]:
            nonlocal calls
            calls += 1
            if calls <= 2:
                raise RuntimeError(f"forwarder bug #{calls}")
            return await real(self, qnames)

        monkeypatch.setattr(MultiQueue, "forward_due", flaky)
        async with server:
            await server.start(mux)
            await client.enqueue(Task("later"), process_in=timedelta(seconds=1))
            await asyncio.wait_for(done.wait(), 15)
    assert server.stats.role_restarts["forwarder"] == 2
    crashes = [e for e in logs if e["event"] == "role crashed; restarting"]
    assert [e["role"] for e in crashes] == ["forwarder", "forwarder"]
    assert all(e["log_level"] == "error" and e["exc_info"] for e in crashes)
    assert crashes[0]["restart_in"] < crashes[1]["restart_in"]  # exponential backoff


async def test_processor_crash_keeps_running_handlers_and_restarts(
    redis: Redis, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []

    async def handle(task: Task) -> None:
        seen.append(task.id or "")

    mux = ServeMux()
    mux.handle("t", handle)
    server = Server(redis, **FAST)
    real = MultiQueue.dequeue
    crashed = False

    async def once_broken(self: MultiQueue, qnames: Any, count: int, **options: Any) -> Any:
        nonlocal crashed
        if not crashed:
            crashed = True
            raise KeyError("processor bug")
        return await real(self, qnames, count, **options)

    monkeypatch.setattr(MultiQueue, "dequeue", once_broken)
    async with server:
        await server.start(mux)
        await client.enqueue_many([Task("t") for _ in range(5)])
        await wait_until(lambda: len(seen) == 5, what="tasks after the restart")
    assert server.stats.role_restarts["processor"] == 1


async def test_unreachable_redis_is_logged_at_a_bounded_rate() -> None:
    with structlog.testing.capture_logs() as logs:
        server = Server(f"redis://127.0.0.1:{free_port()}/0", **FAST)
        async with server:
            await server.start(ServeMux())
            await wait_until(lambda: server.stats.fetch_errors >= 4, what="fetch errors")
    fetch_logs = [e for e in logs if e["event"] == "could not dequeue tasks"]
    # Several failed fetches in well under 3 s: one log line (asynq's 1 per 3 s).
    assert server.stats.fetch_errors >= 4
    assert 1 <= len(fetch_logs) < server.stats.fetch_errors
    assert not server.stats.role_restarts  # Redis errors are not crashes


def test_rate_limiter() -> None:
    now = [0.0]
    rl = RateLimiter(3.0, clock=lambda: now[0])
    assert rl.allow()
    now[0] = 1.0
    assert not rl.allow()
    assert not rl.allow()
    now[0] = 3.0
    assert rl.allow()
    assert rl.take_suppressed() == 2
    assert rl.take_suppressed() == 0


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    b = Backoff(0.05, 1.0)
    delays = [b.next_delay() for _ in range(8)]
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    b.reset()
    assert b.next_delay() == 0.05
    with pytest.raises(ValueError):
        Backoff(0, 1)


async def test_lease_expiry_sets_its_event_once() -> None:
    now = [100.0]
    lease = Lease(130.0, clock=lambda: now[0])
    signal = lease.expired
    assert lease.valid() and not signal.done()
    assert lease.extend(160.0) and lease.expires_at == 160.0
    now[0] = 161.0
    assert not lease.valid()
    assert not lease.extend(200.0)  # an expired lease cannot be revived
    assert not signal.done()  # running out is not declaring it expired: the heartbeater does
    assert lease.expire()
    await asyncio.wait_for(signal, 1)  # an await on the lease's own event returns
    assert not lease.expire()  # declared once
    assert lease.expired is signal and signal.done()
