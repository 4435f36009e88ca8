"""Scheduler failure paths: hooks that raise, run() stopped by a signal, double shutdown,
and Redis going away under a running scheduler."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import structlog
from redis.asyncio import Redis

from asyncq import DuplicateTaskError, Scheduler, Task
from asyncq._scheduling.scheduler import entry_identity, tick_task_id
from tests.support.procs import wait_until
from tests.support.redis_server import RedisServer

FAST: dict[str, Any] = {
    "heartbeat_interval": timedelta(seconds=1),
    "claim_lease": timedelta(milliseconds=500),
}


async def test_raising_hooks_are_logged_and_ticking_goes_on(redis_url: str, redis: Redis) -> None:
    """A post-enqueue hook and an error handler that raise do not stop the scheduler."""
    posts: list[tuple[Any, BaseException | None]] = []
    errors: list[BaseException] = []

    async def post(info: Any, exc: BaseException | None) -> None:
        posts.append((info, exc))
        raise RuntimeError("post hook broke")

    def on_error(task: Task, options: dict[str, Any], exc: BaseException) -> None:
        errors.append(exc)
        raise RuntimeError("error handler broke")

    # Captured, not rendered: once an earlier test in this process has configured
    # structlog (capture_logs does, for good), its default renderer prints each of these
    # tracebacks with every frame's locals, which took seconds per tick under load.
    with structlog.testing.capture_logs() as logs:
        scheduler = Scheduler(redis_url, post_enqueue=post, error_handler=on_error, **FAST)
        # Unique for an hour: the first tick enqueues, every later one is a duplicate.
        scheduler.register("@every 1s", Task("once", b"x"), unique=timedelta(hours=1))
        async with scheduler:
            # Both hooks raise on every call; ticking goes on regardless.
            await wait_until(lambda: len(errors) >= 2, within=20, what="two failed ticks")
    logged = Counter(e["event"] for e in logs if e["log_level"] == "error" and e.get("exc_info"))
    assert logged["post-enqueue hook failed"] == len(posts)
    assert logged["scheduler error handler failed"] == len(errors)
    ok = [info for info, exc in posts if exc is None]
    failed = [exc for info, exc in posts if exc is not None]
    assert len(ok) == 1 and ok[0].type == "once"
    assert len(failed) >= 2 and all(isinstance(e, DuplicateTaskError) for e in failed)
    assert all(isinstance(e, DuplicateTaskError) for e in errors)
    # Exactly the one task was enqueued.
    assert await redis.lrange("asynq:{default}:pending", 0, -1) == [ok[0].id.encode()]


async def test_run_stops_on_sigterm_and_cleans_up(redis_url: str, redis: Redis) -> None:
    scheduler = Scheduler(redis_url, **FAST)
    scheduler.register("@every 1h", Task("hourly"))
    default = signal.getsignal(signal.SIGTERM)
    runner = asyncio.create_task(scheduler.run())

    async def listening() -> bool:
        # Registered in Redis, and run() has put its own SIGTERM handler in place.
        return bool(await redis.zcard("asynq:schedulers")) and (
            signal.getsignal(signal.SIGTERM) is not default
        )

    await wait_until(listening, within=10, what="the scheduler running with its handler")
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(runner, 15)
    # Shutdown removed the scheduler's records, as Go's does.
    assert await redis.zcard("asynq:schedulers") == 0
    assert await redis.keys("asynq:schedulers:*") == []
    # A second shutdown (and one on a scheduler never started) is a no-op.
    await scheduler.shutdown()
    await Scheduler(redis_url).shutdown()


async def test_concurrent_shutdowns_both_wait_for_the_end(redis_url: str, redis: Redis) -> None:
    scheduler = Scheduler(redis_url, **FAST)
    scheduler.register("@every 1h", Task("hourly"))
    await scheduler.start()
    await asyncio.gather(scheduler.shutdown(), scheduler.shutdown())
    assert await redis.zcard("asynq:schedulers") == 0
    assert "closed" in repr(scheduler)


async def test_redis_outage_under_a_running_scheduler(redis: Redis) -> None:
    """Ticks that fall wholly inside an outage are missed (not raised, not enqueued later),
    the scheduler survives, and ticks enqueue again once Redis is back."""
    srv = RedisServer().start()
    enqueued: list[str] = []
    r = Redis.from_url(srv.url)
    task = Task("tick")
    identity = entry_identity("@every 1s", task, {})
    scheduler = Scheduler(
        srv.url,
        post_enqueue=lambda info, exc: enqueued.append(info.id) if info else None,
        misfire_grace=timedelta(seconds=1),
        **FAST,
    )
    scheduler.register("@every 1s", task)
    try:
        async with scheduler:
            await wait_until(lambda: enqueued, within=10, what="a first tick")
            srv.stop()
            down = time.time()
            # Ticks are wall-clock events: let three of them pass while Redis is down.
            await wait_until(lambda: time.time() > down + 3.5, what="three ticks in the outage")
            await asyncio.to_thread(srv.start)
            up = time.time()
            before = len(enqueued)
            await wait_until(
                lambda: len(enqueued) > before,
                within=20,
                what="ticks enqueued again after the restart",
            )
        # A tick t with Redis down for all of [t, t + misfire grace] is missed for good.
        missed = {tick_task_id(identity, t) for t in range(int(down) + 1, int(up)) if t + 1 < up}
        assert missed and not missed & set(enqueued)
        # The restarted Redis (no persistence) holds exactly the ticks enqueued since.
        pending = {m.decode() for m in await r.lrange("asynq:{default}:pending", 0, -1)}
        assert pending and pending <= set(enqueued[before:]) | set(enqueued)
        assert not pending & missed
    finally:
        await r.aclose()
        srv.cleanup()
