"""The scheduler's two lease scripts called directly, one branch each: what each returns and
what the key holds after (scheduler_claim.lua: a tick's claim; scheduler_listing.lua: a
shared entry's listing lease). The schedulers driving them are in test_scheduler.py and
test_cron_keys_hostile.py."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from asyncq._broker import Broker

KEY = "asyncq:scheduler_claims:{ident}:1700000000"
LISTER = "asyncq:scheduler_lister:{ident}"
ME = "host:1:me/entry"
LEASE_MS = 5_000


async def _held(redis: Redis, key: str) -> tuple[bytes | None, int]:
    return await redis.get(key), await redis.pttl(key)


async def test_a_missing_claim_is_taken_with_the_lease(broker: Broker, redis: Redis) -> None:
    assert await broker.claim_tick(KEY, ME, LEASE_MS) == ("claimed", "", 0)
    value, pttl = await _held(redis, KEY)
    assert value == ME.encode() and 0 < pttl <= LEASE_MS


async def test_our_own_claim_is_ours_and_keeps_its_lease(broker: Broker, redis: Redis) -> None:
    await redis.set(KEY, ME, px=1_000)
    assert await broker.claim_tick(KEY, ME, LEASE_MS) == ("claimed", ME, 0)
    value, pttl = await _held(redis, KEY)
    assert value == ME.encode() and 0 < pttl <= 1_000  # not extended: its first lease holds


async def test_a_live_claim_of_another_scheduler_is_held(broker: Broker, redis: Redis) -> None:
    await redis.set(KEY, "host:2:other/entry", px=3_000)
    outcome, holder, pttl = await broker.claim_tick(KEY, ME, LEASE_MS)
    assert (outcome, holder) == ("held", "host:2:other/entry") and 0 < pttl <= 3_000
    assert (await _held(redis, KEY))[0] == b"host:2:other/entry"


async def test_a_done_claim_ends_the_tick(broker: Broker, redis: Redis) -> None:
    await redis.set(KEY, "done:host:2:other:task-1", px=60_000)
    outcome, holder, pttl = await broker.claim_tick(KEY, ME, LEASE_MS)
    assert (outcome, holder) == ("done", "done:host:2:other:task-1") and 0 < pttl <= 60_000
    assert (await _held(redis, KEY))[0] == b"done:host:2:other:task-1"


@pytest.mark.parametrize(
    ("write", "found"),
    [
        (("hset", KEY, "f", "v"), "a hash"),
        (("rpush", KEY, "x"), "a list"),
        (("set", KEY, "host:2:other/entry"), "host:2:other/entry"),  # no expiry
        (("set", KEY, "done:host:2:other:t"), "done:host:2:other:t"),  # no expiry
        (("set", KEY, "no-claim-shape", "PX", "60000"), "no-claim-shape"),
        (("set", KEY, "/entry", "PX", "60000"), "/entry"),  # no scheduler id
        (("set", KEY, "host:2:other/", "PX", "60000"), "host:2:other/"),  # no entry id
        (("set", KEY, b"\xff\xfe", "PX", "60000"), "\\xff\\xfe"),
    ],
)
async def test_what_no_scheduler_writes_is_replaced_by_our_claim(
    broker: Broker, redis: Redis, write: tuple[object, ...], found: str
) -> None:
    await redis.execute_command(*write)
    assert await broker.claim_tick(KEY, ME, LEASE_MS) == ("replaced", found, 0)
    value, pttl = await _held(redis, KEY)
    assert value == ME.encode() and 0 < pttl <= LEASE_MS


async def test_the_listing_lease_is_taken_renewed_and_handed_back(
    broker: Broker, redis: Redis
) -> None:
    assert await broker.hold_listing(LISTER, "me", 2_000) == (True, None)
    value, pttl = await _held(redis, LISTER)
    assert value == b"me" and 0 < pttl <= 2_000
    await redis.pexpire(LISTER, 500)
    assert await broker.hold_listing(LISTER, "me", 2_000) == (True, None)
    assert 500 < (await _held(redis, LISTER))[1] <= 2_000  # renewed
    assert await broker.release_listing(LISTER, "other") is False
    assert (await _held(redis, LISTER))[0] == b"me"
    assert await broker.release_listing(LISTER, "me") is True
    assert await redis.exists(LISTER) == 0


async def test_a_live_listing_lease_of_another_scheduler_is_left(
    broker: Broker, redis: Redis
) -> None:
    await redis.set(LISTER, "other", px=3_000)
    assert await broker.hold_listing(LISTER, "me", 2_000) == (False, None)
    value, pttl = await _held(redis, LISTER)
    assert value == b"other" and 2_000 < pttl <= 3_000


@pytest.mark.parametrize(
    ("write", "found"),
    [
        (("zadd", LISTER, "1", "m"), "a zset"),
        (("set", LISTER, "other"), "other"),  # no expiry
        (("set", LISTER, ""), ""),  # no expiry, empty
    ],
)
async def test_a_listing_lease_no_scheduler_wrote_is_replaced_and_named(
    broker: Broker, redis: Redis, write: tuple[object, ...], found: str
) -> None:
    await redis.execute_command(*write)
    assert await broker.hold_listing(LISTER, "me", 2_000) == (True, found)
    value, pttl = await _held(redis, LISTER)
    assert value == b"me" and 0 < pttl <= 2_000


async def test_a_listing_lease_of_another_type_is_not_handed_back(
    broker: Broker, redis: Redis
) -> None:
    await redis.sadd(LISTER, "me")
    assert await broker.release_listing(LISTER, "me") is False
    assert await redis.type(LISTER) == b"set"
