"""Waiting runs cost nothing while idle: many runs waiting (half for a signal, half in a
sleep) hold no worker slot, none is active, and the forwarder's pass over their queue
costs the same Redis commands with all of them waiting as with one (counted with INFO
commandstats, not timed).

The default suite parks :data:`RUNS` = 500; ``nox -s durable_idle`` sets
``ASYNCQ_DURABLE_IDLE_RUNS=10000``.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._broker import Broker
from tests.support import durable_app as d
from tests.support.helpers import wait_until

RUNS = int(os.environ.get("ASYNCQ_DURABLE_IDLE_RUNS", "500"))


async def commands(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


async def forward_pass_cost(redis: Redis) -> int:
    """The Redis commands (scripts' included) of one forwarder pass over the queue."""
    broker = Broker(redis)
    before = await commands(redis)
    await broker.forward_due([d.QUEUE])
    return await commands(redis) - before


async def park(redis: Redis, n: int, first: int) -> None:
    """Start *n* runs, even ones waiting for a signal and odd ones sleeping an hour, and
    wait until all wait, holding no slot."""
    worker = await d.start_worker()
    try:
        for chunk in range(first, first + n, 500):
            await asyncio.gather(
                *(
                    d.waiter.start(f"k{i}", None) if i % 2 == 0 else d.sleeper.start(3600.0)
                    for i in range(chunk, min(chunk + 500, first + n))
                )
            )

        async def all_parked() -> bool:
            return await redis.zcard(keys.scheduled_key(d.QUEUE)) == first + n

        await wait_until(all_parked, within=60 + n / 20, what="every run waiting")
        await wait_until(lambda: worker.running_tasks == 0, what="every slot free")
        assert await redis.llen(keys.active_key(d.QUEUE)) == 0
        assert await redis.llen(keys.pending_key(d.QUEUE)) == 0
    finally:
        await worker.shutdown()


@pytest.mark.timeout(120 + RUNS // 20)
async def test_waiting_runs_hold_no_slot_and_cost_no_commands(redis: Redis, app: None) -> None:
    await park(redis, 1, 0)
    one = await forward_pass_cost(redis)
    await park(redis, RUNS - 1, 1)
    assert await forward_pass_cost(redis) == one
    assert await redis.zcard(keys.scheduled_key(d.QUEUE)) == RUNS  # none was due
    print(f"\nidle cost: {RUNS} runs waiting, 0 active; a forwarder pass: {one} commands")
