"""Durable functions end to end on a real server, with in-process workers: replay, steps
recorded once, waits that hold no slot, signals, sleeps, fan-out, failures, non-determinism."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from asyncq import Server, TaskFailedError
from asyncq import _keys as keys
from tests.support import durable_app as d


async def ran(redis: Redis) -> dict[str, int]:
    got = await redis.hgetall(d.RAN)
    return {k.decode(): int(v) for k, v in got.items()}


async def test_steps_replay_their_recorded_results(redis: Redis, worker: Server) -> None:
    handle = await d.chain3.start(4)
    assert await handle.result(timeout=20) == 55
    # three steps, each run once although the run replayed from the top four times
    assert await ran(redis) == {f"{handle.id}-{i}": 1 for i in range(3)}
    record = await redis.hgetall(keys.run_key(d.QUEUE, handle.id))
    assert record[b"state"] == b"succeeded"
    assert [record[f"s:{i}".encode()] for i in range(3)] == [
        b'step d:add {"a":4,"b":1}',
        b'step d:mul {"a":5,"b":10}',
        b'step d:add {"a":50,"b":5}',
    ]
    assert [record[f"r:{i}".encode()] for i in range(3)] == [b"5", b"50", b"55"]
