"""One connection layer for client, server and inspector (placeholder; see issue 2 item 5)."""

from __future__ import annotations

from typing import TypeAlias

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

__all__ = ["RedisClient"]

RedisClient: TypeAlias = "Redis | RedisCluster"
