"""Waiting runs cost nothing while idle: many runs waiting for a signal hold no worker slot,
none is active, and the forwarder's pass over their queue costs the same Redis commands
with 500 runs waiting as with one (counted with INFO commandstats, not timed)."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._broker import Broker
from tests.support import durable_app as d
from tests.support.helpers import wait_until

RUNS = 500


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
    """Start *n* runs waiting for a signal and wait until all wait, holding no slot."""
    worker = await d.start_worker()
    try:
        await asyncio.gather(*(d.waiter.start(f"k{first + i}", None) for i in range(n)))

        async def all_parked() -> bool:
            return await redis.zcard(keys.scheduled_key(d.QUEUE)) == first + n

        await wait_until(all_parked, within=120, what="every run waiting")
        await wait_until(lambda: worker.running_tasks == 0, what="every slot free")
        assert await redis.llen(keys.active_key(d.QUEUE)) == 0
    finally:
        await worker.shutdown()


async def test_waiting_runs_hold_no_slot_and_cost_no_commands(redis: Redis, app: None) -> None:
    await park(redis, 1, 0)
    one = await forward_pass_cost(redis)
    await park(redis, RUNS - 1, 1)
    assert await forward_pass_cost(redis) == one
    assert await redis.zcard(keys.scheduled_key(d.QUEUE)) == RUNS  # none was due
