"""dequeue_queues.lua called directly: its whole reply and every key afterwards.

The broker reads the reply's ``empty`` and ``held`` lists as sets (they decide which
queues a worker waits on before polling again) and ``full`` only as a truth value,
so the tests through the broker cannot tell a position listed twice, a queue
missing from one list, or full = 2 from the script's documented reply. These call
the script the way :meth:`MultiQueue.dequeue` does (see the script's header for the
arguments) over several queues at once and compare the reply exactly, and the
Redis state key by key.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from asyncq._redis.scripts import load_script
from tests.support.helpers import pexpiretime, snapshot

# Loaded at import, like the broker's copy: the mutation runner swaps loaded scripts.
DEQUEUE = load_script("asyncq._broker", "dequeue_queues")
LEASE_UNTIL = "4102444800"  # ARGV[1]: 2100-01-01
NOW = "1700000000"  # ARGV[6]: live leases score at or after it; none is set here


def k(queue: str, suffix: str) -> str:
    return f"asynq:{{{queue}}}:{suffix}"


async def call(
    redis: Redis,
    names: list[str],
    *,
    want: int = 10,
    budget: int = -1,
    first_free: bool = False,
    limits: str = "",
) -> list[Any]:
    args = [LEASE_UNTIL, str(want), str(budget), "1" if first_free else "0", "200", NOW, limits]
    return list(await DEQUEUE(redis, [], [*args, *names]))


async def pending(redis: Redis, queue: str, *ids: str) -> None:
    """*ids* pending in *queue*, the first one taken first (RPOPLPUSH takes the tail)."""
    for tid in ids:
        await redis.hset(k(queue, "t:" + tid), mapping={"msg": "m-" + tid, "state": "pending"})
        await redis.lpush(k(queue, "pending"), tid)


async def state(redis: Redis) -> dict[str, Any]:
    """Every key as :func:`tests.support.helpers.snapshot` reads it, with its type and whether it
    expires."""
    return {
        key: ((await redis.type(key)).decode(), value, await redis.pttl(key) >= 0)
        for key, value in (await snapshot(redis)).items()
    }


def active_hash(tid: str) -> tuple[str, dict[bytes, bytes], bool]:
    return ("hash", {b"msg": b"m-" + tid.encode(), b"state": b"active"}, False)


def leased(*ids: str) -> tuple[str, list[tuple[bytes, float]], bool]:
    return ("zset", [(tid.encode(), float(LEASE_UNTIL)) for tid in sorted(ids)], False)


def taken(*pairs: tuple[int, str]) -> list[Any]:
    out: list[Any] = []
    for pos, tid in pairs:
        out += [pos, tid.encode(), b"m-" + tid.encode()]
    return out


@pytest.mark.parametrize(
    ("suffix", "plant", "kind"),
    [
        ("active", "string", "list"),
        ("lease", "list", "zset"),
        ("asyncq:limit", "hash", "string"),
        ("asyncq:rate", "string", "hash"),
    ],
)
async def test_a_wrong_typed_key_is_named_with_the_type_it_should_have(
    redis: Redis, suffix: str, plant: str, kind: str
) -> None:
    # The caller logs the key from this text (MultiQueue._skipped's parsing of "WRONGTYPE
    # <key> is not a <type>"), so the key and the expected type are both part of the reply.
    await pending(redis, "default", "p1")
    key = k("default", suffix)
    if plant == "string":
        await redis.set(key, "x")
    elif plant == "list":
        await redis.rpush(key, "x")
    else:
        await redis.hset(key, "x", "y")
    before = await state(redis)
    with pytest.raises(ResponseError) as err:
        await call(redis, ["default"], limits="1:-1:-1:1000000:5")
    assert str(err.value) == f"WRONGTYPE {key} is not a {kind}"
    assert await state(redis) == before


async def test_a_pending_id_without_its_hash_is_taken_out_of_active_again_alone(
    redis: Redis,
) -> None:
    # "ghost" is next in pending but its hash is gone; the same id is also in active
    # already (another lease's entry, or an earlier leftover): the script takes out
    # only the entry it pushed, and writes nothing for the ghost.
    await pending(redis, "default", "ghost", "p1")
    await redis.delete(k("default", "t:ghost"))
    await redis.rpush(k("default", "active"), "a1", "ghost")
    await redis.hset(k("default", "t:a1"), mapping={"msg": "m-a1", "state": "active"})
    await redis.zadd(k("default", "lease"), {"a1": int(LEASE_UNTIL)})
    reply = await call(redis, ["default"])
    assert reply == [[1], [1, b"ghost", None, *taken((1, "p1"))], 0, []]
    assert await state(redis) == {
        k("default", "active"): ("list", [b"p1", b"a1", b"ghost"], False),
        k("default", "lease"): leased("a1", "p1"),
        k("default", "t:a1"): active_hash("a1"),
        k("default", "t:p1"): active_hash("p1"),
    }


async def test_held_and_empty_list_each_queue_once_in_the_order_looked_at(
    redis: Redis,
) -> None:
    # paused: work but paused (empty); none: no pending list (empty); lim: a local room
    # of 1 with two pending (held); exact: a room of 1 with one pending (drained by
    # its limit: neither held nor looked at empty); one: drained (empty); more: drained.
    await pending(redis, "paused", "x1")
    await redis.set(k("paused", "paused"), "1")
    await pending(redis, "lim", "l1", "l2")
    await pending(redis, "exact", "e1")
    await pending(redis, "one", "o1")
    await pending(redis, "more", "m1", "m2")
    names = ["paused", "none", "lim", "exact", "one", "more"]
    reply = await call(redis, names, limits="3:-1:1;4:-1:1")
    got = taken((3, "l1"), (4, "e1"), (5, "o1"), (6, "m1"), (6, "m2"))
    assert reply == [[1, 2, 5, 6], got, 0, [3]]
    after = await state(redis)
    assert after[k("lim", "pending")] == ("list", [b"l2"], False)
    assert k("exact", "pending") not in after
    assert after[k("paused", "pending")] == ("list", [b"x1"], False)


async def test_a_queue_that_gives_the_last_task_wanted_is_neither_held_nor_empty(
    redis: Redis,
) -> None:
    # The count stopped the call, not a limit: "a" keeps a task, "b" is not looked at.
    await pending(redis, "a", "a1", "a2", "a3")
    await pending(redis, "b", "b1")
    reply = await call(redis, ["a", "b"], want=2)
    assert reply == [[], taken((1, "a1"), (1, "a2")), 0, []]
    assert (await state(redis))[k("a", "pending")] == ("list", [b"a3"], False)


async def test_a_queue_drained_by_the_last_task_wanted_is_listed_empty_after_earlier_ones(
    redis: Redis,
) -> None:
    await pending(redis, "a", "a1", "a2")
    await pending(redis, "b", "b1")
    reply = await call(redis, ["e", "a", "b"], want=2)
    assert reply == [[1, 2], taken((2, "a1"), (2, "a2")), 0, []]


async def test_the_byte_budget_stops_the_call_with_full_set_and_nothing_held(
    redis: Redis,
) -> None:
    # a1's message is 4 bytes ("m-a1"): a budget of 5 takes it and stops before a2.
    await pending(redis, "a", "a1", "a2")
    await pending(redis, "b", "b1")
    reply = await call(redis, ["a", "b"], budget=5)
    assert reply == [[], taken((1, "a1")), 1, []]
    after = await state(redis)
    assert after[k("a", "pending")] == ("list", [b"a2"], False)
    assert after[k("b", "pending")] == ("list", [b"b1"], False)


async def test_a_rate_limited_queue_that_gives_nothing_writes_no_bucket(redis: Redis) -> None:
    # The bucket had a token, but the first task is over the budget: nothing is taken,
    # so the bucket's state (and its expiry) must not be written either.
    await pending(redis, "r", "r1")
    before = await state(redis)
    reply = await call(redis, ["r"], budget=1, limits="1:-1:-1:1000000:5")
    assert reply == [[], [], 1, []]
    assert await state(redis) == before


async def test_the_rate_bucket_is_written_with_its_expiry_an_hour_past_a_full_bucket(
    redis: Redis,
) -> None:
    # With no stored bucket tat starts at the call's Redis TIME t, and one task moves
    # it to t + interval: the key expires (t + interval) - t = interval µs, in ms, plus
    # an hour after the call. The interval is long (about 11.6 days) so a wrong unit
    # or rounding would move the expiry by minutes, far outside the call's duration.
    interval = 10**12
    await pending(redis, "r", "r1", "r2")
    sec, usec = await redis.time()
    start_ms = sec * 1000 + usec // 1000
    reply = await call(redis, ["r"], limits=f"1:-1:-1:{interval}:1")
    sec, usec = await redis.time()
    end_ms = sec * 1000 + usec // 1000 + 1
    assert reply == [[], taken((1, "r1")), 0, [1]]
    bucket = await redis.hgetall(k("r", "asyncq:rate"))
    assert bucket.keys() == {b"tat", b"interval", b"burst"}
    assert bucket[b"interval"] == str(interval).encode() and bucket[b"burst"] == b"1"
    tat = int(bucket[b"tat"])
    assert start_ms * 1000 <= tat - interval <= end_ms * 1000
    ttl = interval // 1000 + 3_600_000
    assert start_ms + ttl <= await pexpiretime(redis, k("r", "asyncq:rate")) <= end_ms + ttl
