"""Helpers shared by the test modules: broker test data, Redis snapshots, polling.

Fixtures live in tests/conftest.py; this module holds plain functions and constants.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from asyncq import ServeMux
from asyncq import _keys as keys
from asyncq._redis.transport import FastConnection
from asyncq.proto.asynq import TaskMessage

Q = "default"
T_PREFIX = "asynq:{default}:t:"
PENDING = "asynq:{default}:pending"
SCHEDULED = "asynq:{default}:scheduled"
NS = 1_000_000_000


class FakeClock:
    """Injectable broker clock: unix seconds, moved by tests."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    @property
    def dt(self) -> datetime:
        return datetime.fromtimestamp(self.now, UTC)


def same_day_now(margin: float = 120.0) -> datetime:
    """Now (UTC, whole seconds), at least *margin* seconds before the next UTC midnight.

    A test that seeds today's daily counters (``processed:<date>``) and reads them back
    through code on the real clock must not see the day change in between: within the
    day's last *margin* seconds this sleeps until the next day has begun.
    """
    now = datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    left = (midnight - now).total_seconds()
    if left < margin:
        time.sleep(left + 0.01)
        now = datetime.now(UTC)
    return now.replace(microsecond=0)


def make_msg(task_id: str = "t1", queue: str = Q, **fields: Any) -> TaskMessage:
    fields.setdefault("type", "email:send")
    fields.setdefault("payload", b'{"to":"a@b.c"}')
    fields.setdefault("retry", 25)
    fields.setdefault("timeout", 1800)
    return TaskMessage(id=task_id, queue=queue, **fields)


async def snapshot(r: Redis) -> dict[str, Any]:
    """Every key with its full value (bytes, dict, list, zset pairs or set)."""
    out: dict[str, Any] = {}
    for raw in sorted(await r.keys("*")):
        key = raw.decode()
        kind = (await r.type(raw)).decode()
        if kind == "string":
            out[key] = await r.get(raw)
        elif kind == "hash":
            out[key] = await r.hgetall(raw)
        elif kind == "list":
            out[key] = await r.lrange(raw, 0, -1)
        elif kind == "zset":
            out[key] = await r.zrange(raw, 0, -1, withscores=True)
        elif kind == "set":
            out[key] = await r.smembers(raw)
        else:  # pragma: no cover - the broker writes nothing else
            raise AssertionError(f"unexpected type {kind} for {key}")
    return out


async def dump_all(redis: Redis) -> dict[bytes, tuple[bytes, Any, int]]:
    """Every key: its type, DUMP bytes and expiry (to show a failed call changed nothing)."""
    return {
        key: (await redis.type(key), await redis.dump(key), await redis.pttl(key))
        for key in sorted(await redis.keys("*"))
    }


async def pexpiretime(r: Redis, key: str | bytes) -> int:
    """Absolute expiry (unix ms); -1 = no TTL, -2 = no key.

    PEXPIRETIME on Redis 7.0 and later; on 6.2 (``nox -s servers``) the server's TIME
    plus PTTL, read in one transaction.
    """
    try:
        return int(await r.execute_command("PEXPIRETIME", key))
    except ResponseError as exc:
        if "unknown command" not in str(exc).lower():
            raise
    async with r.pipeline(transaction=True) as pipe:
        pipe.time()
        pipe.pttl(key)
        (sec, usec), pttl = await pipe.execute()
    return int(pttl) if pttl < 0 else sec * 1000 + usec // 1000 + int(pttl)


async def expiretime(r: Redis, key: str | bytes) -> int:
    """Absolute expiry (unix s); -1 = no TTL, -2 = no key (EXPIRETIME, or 6.2's TIME + PTTL)."""
    ms = await pexpiretime(r, key)
    # TIME + PTTL may be a millisecond off an expiry set in whole seconds (EXPIREAT).
    return ms if ms < 0 else round(ms / 1000)


async def assert_relative_ttl(r: Redis, key: str, clock: FakeClock, ttl: int) -> None:
    """A TTL set relative to Redis' real clock (SET EX, EXPIRE): *ttl* s after the fake now,
    allowing for the real time that passed since and for Redis rounding to whole seconds."""
    exp = await expiretime(r, key)
    assert int(clock.now) + ttl <= exp <= int(time.time()) + ttl + 1, (exp, clock.now, ttl)


_ORPHANS = """
local out = {}
for _, name in ipairs({"pending", "active"}) do
    for _, id in ipairs(redis.call("LRANGE", ARGV[1] .. name, 0, -1)) do
        if redis.call("EXISTS", ARGV[1] .. "t:" .. id) == 0 then
            out[#out + 1] = name .. ":" .. id
        end
    end
end
for _, name in ipairs({"scheduled", "retry", "archived", "completed", "lease"}) do
    for _, id in ipairs(redis.call("ZRANGE", ARGV[1] .. name, 0, -1)) do
        if redis.call("EXISTS", ARGV[1] .. "t:" .. id) == 0 then
            out[#out + 1] = name .. ":" .. id
        end
    end
end
return out
"""


async def assert_ids_have_hashes(r: Redis, queue: str = Q) -> None:
    """The invariant: no id in a list or zset of *queue* without its task hash."""
    orphans = await r.eval(_ORPHANS, 0, keys.queue_key_prefix(queue))  # type: ignore[misc]
    assert orphans == []


async def wait_until(
    predicate: Callable[[], Any | Awaitable[Any]],
    *,
    within: float = 15.0,
    interval: float = 0.01,
    what: str = "condition",
) -> Any:
    """Poll *predicate* (sync or async) until it returns a truthy value (at most *within* s)."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)


def one_handler(task_type: str, fn: Callable[[Any], Any]) -> ServeMux:
    """A ServeMux with a single handler."""
    mux = ServeMux()
    mux.handle(task_type, fn)
    return mux


async def wait_state(redis: Redis, task_id: str, state: str, queue: str = Q) -> dict[bytes, bytes]:
    """Wait until the task hash says *state*; returns the hash."""

    async def check() -> dict[bytes, bytes] | None:
        h: dict[bytes, bytes] = await redis.hgetall(keys.task_key(queue, task_id))
        return h if h.get(b"state") == state.encode() else None

    result: dict[bytes, bytes] = await wait_until(check, what=f"task {task_id} in state {state}")
    return result


async def wait_gone(redis: Redis, task_id: str, queue: str = Q) -> None:
    """Wait until the task hash is deleted."""

    async def gone() -> bool:
        return not await redis.exists(keys.task_key(queue, task_id))

    await wait_until(gone, what=f"task {task_id} deleted")


async def push_go_task(redis: Redis, queue: str, task_id: str, payload: bytes = b"") -> None:
    """A pending task written as Go asynq (or redis-cli) writes it: no wake-up message."""
    msg = TaskMessage(type="t", payload=payload, id=task_id, queue=queue, retry=25, timeout=1800)
    await redis.hset(
        keys.task_key(queue, task_id),
        mapping={"msg": bytes(msg), "state": "pending", "pending_since": time.time_ns()},
    )
    await redis.lpush(keys.pending_key(queue), task_id)


@asynccontextmanager
async def delivery_notes(redis: Redis, server_id: str) -> AsyncIterator[asyncio.Queue[bytes]]:
    """Subscribed to *server_id*'s delivery channel while open; the notes arrive on the queue."""
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.delivery_channel(server_id))
    notes: asyncio.Queue[bytes] = asyncio.Queue()

    async def read() -> None:
        async for msg in pubsub.listen():
            if msg["type"] == "message":
                await notes.put(msg["data"])

    async def counted() -> bool:
        # Subscribed once the server counts it (what the enqueue asks), not once sent.
        reply = await redis.execute_command("PUBSUB", "NUMSUB", keys.delivery_channel(server_id))
        return bool(reply[1] > 0)

    task = asyncio.create_task(read())
    try:
        await wait_until(counted, what="the subscription")
        yield notes
    finally:
        task.cancel()
        await pubsub.aclose()


class _CountingWriter:
    """A transport that records each write and hands everything to *real*."""

    def __init__(self, real: Any, written: list[bytes]) -> None:
        self._real = real
        self._written = written

    def write(self, data: bytes) -> None:
        self._written.append(bytes(data))
        self._real.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextmanager
def counted_writes(fast: FastConnection) -> Iterator[list[bytes]]:
    """The socket writes *fast* makes meanwhile, in order (it must be connected).

    Wraps its protocol's transport, so every send() the connection makes is one entry.
    """
    proto: Any = fast._proto
    assert proto is not None and proto.transport is not None, "connect it first"
    real = proto.transport
    written: list[bytes] = []
    proto.transport = _CountingWriter(real, written)
    try:
        yield written
    finally:
        proto.transport = real
