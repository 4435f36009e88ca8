"""Temporary Redis ACL users for the tests that check permission handling."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError


@asynccontextmanager
async def temporary_acl_user(
    redis: Redis, redis_url: str, prefix: str, *rules: str
) -> AsyncIterator[str]:
    """The URL of a new ACL user with password ``pw`` and *rules*, deleted afterwards.

    Skips the test on a Redis without ACL channel rules (before 6.2).
    """
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        await redis.execute_command("ACL", "SETUSER", name, "on", ">pw", *rules)
    except ResponseError as exc:
        pytest.skip(f"this Redis has no ACL channel rules: {exc}")
    host = redis_url.split("://", 1)[1]
    try:
        yield f"redis://{name}:pw@{host}"
    finally:
        await redis.execute_command("ACL", "DELUSER", name)
