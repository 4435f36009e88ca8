"""The worker's lean Pub/Sub connection behaves as the redis-py PubSub subset it replaces."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError

from asyncq._redis.connection import Connection
from asyncq._redis.pubsub import FastPubSub, FastPubSubClient
from tests.support.acl import temporary_acl_user


async def _confirmed(ps: FastPubSub, n: int) -> list[dict[str, object]]:
    out = []
    while len(out) < n:
        msg = await ps.get_message(timeout=5.0)
        assert msg is not None, "no confirmation within 5 s"
        out.append(msg)
    return out


async def test_messages_patterns_and_confirmations(redis: Redis, redis_url: str) -> None:
    async with Connection(redis_url) as conn:
        source = await conn.pubsub()
        assert isinstance(source, FastPubSubClient)
        ps = source.pubsub()
        try:
            await ps.subscribe(b"a", "b")
            await ps.psubscribe("p:*")
            confirmations = await _confirmed(ps, 3)
            assert [m["type"] for m in confirmations] == ["subscribe", "subscribe", "psubscribe"]
            assert [m["channel"] for m in confirmations] == [b"a", b"b", b"p:*"]
            assert set(ps.channels) == {b"a", b"b"} and set(ps.patterns) == {b"p:*"}
            assert await ps.get_message(timeout=0.05) is None  # nothing published yet
            await redis.publish("b", "x")
            await redis.publish("p:1", "y")
            await redis.publish("c", "not subscribed")
            first = await ps.get_message(ignore_subscribe_messages=True, timeout=5.0)
            second = await ps.get_message(ignore_subscribe_messages=True, timeout=5.0)
            assert first == {"type": "message", "pattern": None, "channel": b"b", "data": b"x"}
            assert second == {
                "type": "pmessage",
                "pattern": b"p:*",
                "channel": b"p:1",
                "data": b"y",
            }
            await ps.unsubscribe("b")
            # Publish only once the server has confirmed: sent together, the two commands
            # come from two connections, and the server may run the PUBLISH first.
            unsub = await ps.get_message(timeout=5.0)
            assert unsub is not None and unsub["type"] == "unsubscribe"
            assert unsub["channel"] == b"b"
            assert await redis.publish("b", "after") == 0  # no subscriber left on b
            assert await ps.get_message(ignore_subscribe_messages=True, timeout=0.1) is None
            assert set(ps.channels) == {b"a"}
        finally:
            await ps.aclose()


async def test_refused_channel_raises_no_permission(redis: Redis, redis_url: str) -> None:
    rules = ("resetchannels", "&allowed", "+@all", "~*")
    async with (
        temporary_acl_user(redis, redis_url, "fastpubsub", *rules) as url,
        Connection(url) as conn,
    ):
        ps = (await conn.pubsub()).pubsub()  # type: ignore[union-attr]
        try:
            await ps.subscribe("allowed")
            assert (await _confirmed(ps, 1))[0]["type"] == "subscribe"
            await ps.subscribe("denied")
            with pytest.raises(NoPermissionError):
                await ps.get_message(timeout=5.0)
        finally:
            await ps.aclose()


async def test_lost_connection_raises_connection_error(redis: Redis, redis_url: str) -> None:
    async with Connection(redis_url) as conn:
        ps = (await conn.pubsub()).pubsub()  # type: ignore[union-attr]
        try:
            await ps.subscribe("gone")
            await _confirmed(ps, 1)
            await redis.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            with pytest.raises(RedisConnectionError):
                async with asyncio.timeout(5):
                    while True:
                        await ps.get_message(timeout=1.0)
        finally:
            await ps.aclose()


async def test_a_routed_channel_goes_to_its_callback_as_read(redis: Redis, redis_url: str) -> None:
    """A routed channel's messages skip the inbox: their data reach the callback from the
    connection's reads, in order, and the other channels still queue for get_message."""
    async with Connection(redis_url) as conn:
        ps = (await conn.pubsub()).pubsub()  # type: ignore[union-attr]
        routed: list[bytes] = []
        got_all = asyncio.Event()

        def take(data: bytes) -> None:
            routed.append(data)
            if len(routed) == 3:
                got_all.set()

        ps.route(b"direct", take)
        try:
            await ps.subscribe("direct", "queued")
            assert [m["channel"] for m in await _confirmed(ps, 2)] == [b"direct", b"queued"]
            for data in (b"1", b"2"):
                await redis.publish("direct", data)
            await redis.publish("queued", "q")
            await redis.publish("direct", b"3")
            async with asyncio.timeout(5):
                await got_all.wait()
            assert routed == [b"1", b"2", b"3"]
            queued = await ps.get_message(ignore_subscribe_messages=True, timeout=5.0)
            assert queued is not None and queued["channel"] == b"queued"
            assert queued["data"] == b"q"
            assert await ps.get_message(timeout=0.05) is None  # the routed ones never queued
        finally:
            await ps.aclose()
