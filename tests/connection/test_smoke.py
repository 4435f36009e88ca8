from redis.asyncio import Redis


async def test_redis_fixture_is_empty(redis: Redis) -> None:
    await redis.set("k", "v")
    assert await redis.get("k") == b"v"
    assert await redis.dbsize() == 1
