"""Three scheduler processes share an entry; one is SIGKILLed mid-run: every tick still once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from redis.asyncio import Redis

from asyncq._scheduling.scheduler import entry_identity, tick_task_id
from asyncq.task import Task
from tests.support.helpers import wait_until

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import asyncio, sys
from datetime import timedelta
from redis.asyncio import Redis
from asyncq._scheduling.scheduler import Scheduler
from asyncq.task import Task

async def main(url):
    redis = Redis.from_url(url)

    async def pre_enqueue(task, options):
        await redis.rpush("test:attempts", options["task_id"])

    scheduler = Scheduler(
        url,
        heartbeat_interval=timedelta(seconds=1),
        claim_lease=timedelta(milliseconds=500),
        pre_enqueue=pre_enqueue,
    )
    scheduler.register("@every 1s", Task("kill:test", b"x"))
    await scheduler.run()
    await redis.aclose()

asyncio.run(main(sys.argv[1]))
"""


PENDING = "asynq:{default}:pending"


def spawn(redis_url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, redis_url],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def test_killed_scheduler_does_not_lose_or_double_ticks(redis: Redis, redis_url: str) -> None:
    identity = entry_identity("@every 1s", Task("kill:test", b"x"), {})
    start = int(time.time())
    children = [spawn(redis_url) for _ in range(3)]
    try:
        await wait_until(lambda: _count(redis.zcard("asynq:schedulers"), 3), within=30)
        # Ticks enqueued, not attempts: a take-over may attempt one tick twice.
        await wait_until(lambda: _count(redis.llen(PENDING), 3), within=30)

        victim = children[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        # Its heartbeat record stays until its TTL (2 x heartbeat interval) runs out.
        stale = [
            k for k in await redis.keys("asynq:schedulers:*") if f":{victim.pid}:".encode() in k
        ]
        assert len(stale) == 1 and 0 < await redis.pttl(stale[0]) <= 2000
        at_kill = await redis.llen(PENDING)
        await wait_until(lambda: _count(redis.llen(PENDING), at_kill + 4), within=30)

        for child in children[1:]:
            child.send_signal(signal.SIGTERM)
        for child in children[1:]:
            _, stderr = child.communicate(timeout=20)
            assert child.returncode == 0, stderr.decode()
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    end = int(time.time())

    attempts = [a.decode() for a in await redis.lrange("test:attempts", 0, -1)]
    pending = [p.decode() for p in await redis.lrange(PENDING, 0, -1)]
    by_id = {tick_task_id(identity, t): t for t in range(start, end + 1)}
    assert set(attempts) == set(pending)
    # Only the tick the victim may have been holding can show a second attempt
    # (the take-over), and that one is caught by its derived task ID.
    counts = Counter(attempts)
    assert sum(1 for n in counts.values() if n > 1) <= 1
    assert max(counts.values()) <= 2
    # No tick was lost: they are consecutive from the first to the last.
    ticks = sorted(by_id[p] for p in pending)
    assert ticks == list(range(ticks[0], ticks[-1] + 1))
    assert len(ticks) >= 7

    # The survivors removed their heartbeat records (the victim's expires by its TTL).
    keys = [k.decode() for k in await redis.keys("asynq:schedulers:*")]
    assert not [k for k in keys if f":{children[0].pid}:" not in k]


async def _count(value: object, at_least: int) -> bool:
    assert asyncio.iscoroutine(value) or hasattr(value, "__await__")
    return int(await value) >= at_least  # type: ignore[misc]
