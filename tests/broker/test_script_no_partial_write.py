"""Worker-side and inspector scripts refuse before their first write.

A key the script would write after a first write (a lease set, a counter, a
group, a unique lock, a task hash) is planted with another type; the script
must then fail and leave every key exactly as it was. Each case also runs once
without the planted key, so the KEYS/ARGV given are known to be right.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from asyncq._redis.scripts import load_script
from tests.support import transitions
from tests.support.helpers import expiretime

Q = "asynq:{default}:"
TP = Q + "t:"
GP = Q + "g:"
ACTIVE, LEASE, PENDING, PAUSED = Q + "active", Q + "lease", Q + "pending", Q + "paused"
SCHEDULED, RETRY, ARCHIVED, COMPLETED = (
    Q + "scheduled",
    Q + "retry",
    Q + "archived",
    Q + "completed",
)
PDAY, FDAY = Q + "processed:2026-11-23", Q + "failed:2026-11-23"
PTOTAL, FTOTAL = Q + "processed", Q + "failed"
GROUPS = Q + "groups"
LOCK = Q + "unique:lock"
MAXI64 = str(2**63 - 1)
FAR = "4102444800"  # 2100-01-01, a counter expiry in the future
NOW = "1700000000"  # ARGV[6] of dequeue_queues: live leases score at or after it
NOW = "1700000000"
CUTOFF = "1692224000"


async def base_state(r: Redis) -> None:
    """Two active leased tasks, one pending, two scheduled (one grouped), counters."""
    await r.rpush(ACTIVE, "a1", "a2")
    await r.zadd(LEASE, {"a1": 1_900_000_000, "a2": 1_900_000_000})
    for tid in ("a1", "a2"):
        await r.hset(TP + tid, mapping={"msg": b"\x0a\x01x", "state": "active"})
    await r.rpush(PENDING, "p1")
    await r.hset(TP + "p1", mapping={"msg": b"\x0a\x01p", "state": "pending"})
    await r.zadd(SCHEDULED, {"s1": 1, "s2": 2})
    await r.hset(TP + "s1", mapping={"msg": b"\x0a\x01s", "state": "scheduled", "unique_key": LOCK})
    await r.set(LOCK, "s1")
    await r.hset(TP + "s2", mapping={"msg": b"\x0a\x01g", "state": "scheduled", "group": "g"})
    await r.set(PDAY, 3)
    await r.set(PTOTAL, 7)


Plant = Callable[[Redis], Any]


def wrong(key: str, kind: str) -> Plant:
    async def plant(r: Redis) -> None:
        await r.delete(key)
        if kind == "string":
            await r.set(key, "not a counter")
        elif kind == "list":
            await r.rpush(key, "x")
        elif kind == "hash":
            await r.hset(key, "x", "y")
        elif kind == "set":
            await r.sadd(key, "x")
        else:
            await r.zadd(key, {"x": 1})

    plant.__name__ = f"{key.removeprefix(Q)}={kind}"
    return plant


@dataclass(frozen=True)
class Call:
    script: str
    keys: Sequence[str]
    args: Sequence[str]


DONE = Call("done", [ACTIVE, LEASE, TP + "a1", PDAY, PTOTAL, LOCK], ["a1", FAR, MAXI64])
COMPLETE = Call(
    "mark_as_complete",
    [ACTIVE, LEASE, COMPLETED, TP + "a1", PDAY, PTOTAL, LOCK],
    ["a1", FAR, FAR, "msg", MAXI64],
)
RETRY_ = Call(
    "retry",
    [TP + "a1", ACTIVE, LEASE, RETRY, PDAY, FDAY, PTOTAL, FTOTAL],
    ["a1", "msg", FAR, FAR, "1", MAXI64],
)
ARCHIVE = Call(
    "archive",
    [TP + "a1", ACTIVE, LEASE, ARCHIVED, PDAY, FDAY, PTOTAL, FTOTAL, TP],
    ["a1", "msg", NOW, CUTOFF, "10000", FAR, MAXI64],
)
UNDECODABLE = Call(
    "archive_undecodable",
    [TP + "a1", ARCHIVED, ACTIVE, LEASE, PDAY, FDAY, PTOTAL, FTOTAL],
    ["a1", NOW, CUTOFF, "10000", TP, "cannot decode", FAR, MAXI64],
)
REQUEUE = Call("requeue", [ACTIVE, LEASE, PENDING, TP + "a1"], ["a1"])
ACK_MANY = Call(
    "ack_many",
    [ACTIVE, LEASE, COMPLETED, PDAY, PTOTAL],
    [TP, Q, FAR, MAXI64, "dc", "a1", "a2", FAR, "msg"],
)
# A refused first task stays refused when a later one's lock checks out fine.
ACK_MANY_LOCKED = Call(
    "ack_many",
    [ACTIVE, LEASE, COMPLETED, PDAY, PTOTAL],
    [TP, Q, FAR, MAXI64, "cD", "a1", FAR, "msg", "a2", LOCK],
)
# A lock's argument is stepped over: the next task's hash is the one checked.
ACK_MANY_LOCK_FIRST = Call(
    "ack_many",
    [ACTIVE, LEASE, COMPLETED, PDAY, PTOTAL],
    [TP, Q, FAR, MAXI64, "Dc", "a2", LOCK, "a1", FAR, "msg"],
)
DEQUEUE = Call("dequeue_many", [PENDING, PAUSED, ACTIVE, LEASE], [FAR, TP, "5"])
FORWARD = Call("forward", [SCHEDULED, PENDING, GROUPS], [NOW, TP, NOW + "000000000", GP])
RUN = Call("inspect_run_task", [TP + "s1", PENDING, GROUPS], ["s1", Q, GP])
RUN_GROUPED = Call(
    "inspect_archive_task", [TP + "s2", ARCHIVED, GROUPS], ["s2", NOW, CUTOFF, "10000", Q, GP]
)
DELETE = Call("inspect_delete_task", [TP + "s1", GROUPS], ["s1", Q, GP])

CASES: list[tuple[Call, Plant]] = [
    (DONE, wrong(LEASE, "string")),
    (DONE, wrong(PDAY, "list")),
    (DONE, wrong(PTOTAL, "string")),
    (DONE, wrong(LOCK, "hash")),
    (COMPLETE, wrong(COMPLETED, "list")),
    (COMPLETE, wrong(PTOTAL, "set")),
    (COMPLETE, wrong(PDAY, "hash")),
    (COMPLETE, wrong(LOCK, "zset")),
    (RETRY_, wrong(RETRY, "list")),
    (RETRY_, wrong(FDAY, "string")),
    (RETRY_, wrong(FTOTAL, "hash")),
    (ARCHIVE, wrong(ARCHIVED, "set")),
    (ARCHIVE, wrong(FTOTAL, "string")),
    (ARCHIVE, wrong(PDAY, "list")),
    (ARCHIVE, wrong(FDAY, "hash")),
    (ARCHIVE, wrong(PTOTAL, "set")),
    (UNDECODABLE, wrong(ARCHIVED, "list")),
    (UNDECODABLE, wrong(TP + "a1", "list")),
    (UNDECODABLE, wrong(LEASE, "list")),
    (UNDECODABLE, wrong(PDAY, "hash")),
    (UNDECODABLE, wrong(FDAY, "set")),
    (UNDECODABLE, wrong(PTOTAL, "string")),
    (UNDECODABLE, wrong(FTOTAL, "list")),
    (REQUEUE, wrong(PENDING, "zset")),
    (REQUEUE, wrong(TP + "a1", "set")),
    (ACK_MANY, wrong(PTOTAL, "string")),
    (ACK_MANY, wrong(PDAY, "hash")),
    (ACK_MANY, wrong(TP + "a2", "list")),
    (ACK_MANY_LOCKED, wrong(TP + "a1", "list")),
    (ACK_MANY_LOCKED, wrong(LOCK, "hash")),
    (ACK_MANY_LOCK_FIRST, wrong(TP + "a1", "zset")),
    (ACK_MANY, wrong(COMPLETED, "set")),
    (DEQUEUE, wrong(LEASE, "set")),
    (DEQUEUE, wrong(TP + "p1", "list")),
    (FORWARD, wrong(PENDING, "set")),
    (FORWARD, wrong(GROUPS, "list")),
    (FORWARD, wrong(GP + "g", "list")),
    (FORWARD, wrong(TP + "s2", "string")),
    (RUN, wrong(PENDING, "hash")),
    (RUN_GROUPED, wrong(ARCHIVED, "list")),
    (DELETE, wrong(LOCK, "list")),
]


async def dump(r: Redis) -> dict[bytes, tuple[bytes, Any, int]]:
    """Every key: type, full value and absolute expiry (DUMP bytes are exact)."""
    out: dict[bytes, tuple[bytes, Any, int]] = {}
    for key in sorted(await r.keys("*")):
        out[key] = (
            await r.type(key),
            await r.dump(key),
            await expiretime(r, key),
        )
    return out


def case_id(case: tuple[Call, Plant]) -> str:
    return f"{case[0].script}-{case[1].__name__}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
async def test_script_fails_with_nothing_written(redis: Redis, case: tuple[Call, Plant]) -> None:
    call, plant = case
    script = transitions.script(call.script)
    await base_state(redis)
    await script(redis, call.keys, call.args)  # the call itself is right: it succeeds
    await redis.flushdb()
    await base_state(redis)
    await plant(redis)
    before = await dump(redis)
    with pytest.raises(ResponseError, match=r"WRONGTYPE|not an integer"):
        await script(redis, call.keys, call.args)
    assert await dump(redis) == before


async def test_dequeue_stops_before_a_later_wrong_typed_hash(redis: Redis) -> None:
    """The ids before the bad one are taken whole; the bad one stays pending, untouched."""
    script = transitions.script("dequeue_many")
    await redis.rpush(PENDING, "bad", "ok")  # the tail ("ok") is taken first
    await redis.hset(TP + "ok", mapping={"msg": b"m", "state": "pending", "pending_since": "1"})
    await redis.set(TP + "bad", "not a hash")
    got = await script(redis, DEQUEUE.keys, DEQUEUE.args)
    assert got == [b"ok", b"m"]
    assert await redis.lrange(PENDING, 0, -1) == [b"bad"]
    assert await redis.lrange(ACTIVE, 0, -1) == [b"ok"]
    assert await redis.zrange(LEASE, 0, -1, withscores=True) == [(b"ok", float(FAR))]
    assert await redis.hgetall(TP + "ok") == {b"msg": b"m", b"state": b"active"}
    before = await dump(redis)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await script(redis, DEQUEUE.keys, DEQUEUE.args)
    assert await dump(redis) == before


@pytest.mark.parametrize("planted", ["lease", "hash"])
async def test_dequeue_queues_fails_with_nothing_written(redis: Redis, planted: str) -> None:
    """The many-queue fetch: a wrong-typed lease set or task hash in the first queue
    tried fails the call before anything moves."""
    script = load_script("asyncq._broker", "dequeue_queues")
    await base_state(redis)
    if planted == "lease":
        await wrong(LEASE, "list")(redis)
    else:
        await wrong(TP + "p1", "set")(redis)
    before = await dump(redis)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await script(redis, [], [FAR, "5", "-1", "0", "10", "0", "", "default"])
    assert await dump(redis) == before


async def test_dequeue_queues_stops_at_a_later_bad_queue(redis: Redis) -> None:
    """Tasks taken from an earlier queue are taken whole; the bad queue is untouched."""
    script = load_script("asyncq._broker", "dequeue_queues")
    await redis.rpush("asynq:{low}:pending", "l1")
    await redis.hset("asynq:{low}:t:l1", mapping={"msg": b"m", "state": "pending"})
    await redis.rpush(PENDING, "p1")
    await redis.set(LEASE, "not a zset")
    _, taken, full, _ = await script(
        redis, [], [FAR, "5", "-1", "0", "10", "0", "", "low", "default"]
    )
    assert taken == [1, b"l1", b"m"] and full == 0
    assert await redis.lrange(PENDING, 0, -1) == [b"p1"]
    assert not await redis.exists(ACTIVE)
    assert await redis.zrange("asynq:{low}:lease", 0, -1) == [b"l1"]
