"""Wire-compatibility audit: asyncq's Redis state read and written with Go asynq v0.26's rules.

The Go side is simulated by Lua written here from the spec (sections 3.2 and 3.4), not taken
from asyncq: Go's dequeue, done, mark-as-complete, retry and forward, and the memory-usage
script of *released* asynq (v0.26.0 and the v0.24.1 inside asynqmon 0.7), which has no nil
guard and fails on any task ID whose ``t:<id>`` hash is missing (spec 3.4, gotcha 17).
Key names are spelled by hand, as in tests/support/gofixtures.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

import asyncq
from asyncq import Intervals
from asyncq._broker import Broker
from asyncq._inspection.inspector import Inspector
from asyncq._producer.client import Client
from asyncq._worker.server import Server
from asyncq.errors import FailedPreconditionError, RevokeTask, SkipRetry, TaskIdConflictError
from asyncq.mux import ServeMux
from asyncq.task import Task, TaskState
from tests.support import gofixtures as go
from tests.support import transitions
from tests.support.acl import temporary_acl_user
from tests.support.gofixtures import GoTask
from tests.support.procs import FAST, wait_until

MAXI64 = 9223372036854775807
DAY90 = 90 * 24 * 3600


def p(queue: str) -> str:
    return f"asynq:{{{queue}}}:"


# -- Go asynq v0.26 scripts, from the spec ----------------------------------------------------

GO_DEQUEUE = """
if redis.call("EXISTS", KEYS[2]) == 0 then
    local id = redis.call("RPOPLPUSH", KEYS[1], KEYS[3])
    if id then
        local key = ARGV[2] .. id
        redis.call("HSET", key, "state", "active")
        redis.call("HDEL", key, "pending_since")
        redis.call("ZADD", KEYS[4], ARGV[1], id)
        return redis.call("HGET", key, "msg")
    end
end
return nil
"""

GO_DONE = """
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then return redis.error_reply("NOT FOUND") end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then return redis.error_reply("NOT FOUND") end
if redis.call("DEL", KEYS[3]) == 0 then return redis.error_reply("NOT FOUND") end
if redis.call("INCR", KEYS[4]) == 1 then redis.call("EXPIREAT", KEYS[4], ARGV[2]) end
if redis.call("GET", KEYS[5]) == ARGV[3] then
    redis.call("SET", KEYS[5], 1)
else
    redis.call("INCR", KEYS[5])
end
if KEYS[6] and redis.call("GET", KEYS[6]) == ARGV[1] then redis.call("DEL", KEYS[6]) end
return redis.status_reply("OK")
"""

GO_MARK_AS_COMPLETE = """
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then return redis.error_reply("NOT FOUND") end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then return redis.error_reply("NOT FOUND") end
if redis.call("ZADD", KEYS[3], ARGV[3], ARGV[1]) ~= 1 then
    return redis.error_reply("INTERNAL")
end
redis.call("HSET", KEYS[4], "msg", ARGV[4], "state", "completed")
if redis.call("INCR", KEYS[5]) == 1 then redis.call("EXPIREAT", KEYS[5], ARGV[2]) end
if redis.call("GET", KEYS[6]) == ARGV[5] then
    redis.call("SET", KEYS[6], 1)
else
    redis.call("INCR", KEYS[6])
end
if KEYS[7] and redis.call("GET", KEYS[7]) == ARGV[1] then redis.call("DEL", KEYS[7]) end
return redis.status_reply("OK")
"""

GO_RETRY = """
if redis.call("LREM", KEYS[2], 0, ARGV[1]) == 0 then return redis.error_reply("NOT FOUND") end
if redis.call("ZREM", KEYS[3], ARGV[1]) == 0 then return redis.error_reply("NOT FOUND") end
redis.call("ZADD", KEYS[4], ARGV[3], ARGV[1])
redis.call("HSET", KEYS[1], "msg", ARGV[2], "state", "retry")
if tonumber(ARGV[5]) == 1 then
    if redis.call("INCR", KEYS[5]) == 1 then redis.call("EXPIREAT", KEYS[5], ARGV[4]) end
    if redis.call("INCR", KEYS[6]) == 1 then redis.call("EXPIREAT", KEYS[6], ARGV[4]) end
    if redis.call("GET", KEYS[7]) == ARGV[6] then
        redis.call("SET", KEYS[7], 1)
        redis.call("SET", KEYS[8], 1)
    else
        redis.call("INCR", KEYS[7])
        redis.call("INCR", KEYS[8])
    end
end
return redis.status_reply("OK")
"""

GO_FORWARD = """
local ids = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1], "LIMIT", 0, 100)
for _, id in ipairs(ids) do
    local key = ARGV[2] .. id
    local group = redis.call("HGET", key, "group")
    if group and group ~= "" then
        redis.call("ZADD", ARGV[4] .. group, ARGV[1], id)
        redis.call("ZREM", KEYS[1], id)
        redis.call("HSET", key, "state", "aggregating")
    else
        redis.call("LPUSH", KEYS[2], id)
        redis.call("ZREM", KEYS[1], id)
        redis.call("HSET", key, "state", "pending", "pending_since", ARGV[3])
    end
end
return #ids
"""

# Released asynq's memoryUsage: MEMORY USAGE of a missing hash is nil, and adding it fails.
GO_MEMORY_USAGE_RELEASED = """
local sample_size = tonumber(ARGV[2])
local memusg = 0
for i = 1, 6 do
    local ids, n
    if i <= 2 then
        ids = redis.call("LRANGE", KEYS[i], 0, sample_size - 1)
        n = redis.call("LLEN", KEYS[i])
    else
        ids = redis.call("ZRANGE", KEYS[i], 0, sample_size - 1)
        n = redis.call("ZCARD", KEYS[i])
    end
    if #ids > 0 then
        local sample_total = 0
        for _, id in ipairs(ids) do
            local bytes = redis.call("MEMORY", "USAGE", ARGV[1] .. id)
            sample_total = sample_total + bytes
        end
        memusg = memusg + (sample_total / #ids) * n
    end
    local m = redis.call("MEMORY", "USAGE", KEYS[i])
    if m then memusg = memusg + m end
end
local groups = redis.call("SMEMBERS", KEYS[7])
if #groups > 0 then
    local count, total, sampled = 0, 0, 0
    for i, gname in ipairs(groups) do
        local gkey = ARGV[4] .. gname
        count = count + redis.call("ZCARD", gkey)
        if i <= tonumber(ARGV[3]) then
            for _, id in ipairs(redis.call("ZRANGE", gkey, 0, sample_size - 1)) do
                local bytes = redis.call("MEMORY", "USAGE", ARGV[1] .. id)
                total = total + bytes
                sampled = sampled + 1
            end
        end
    end
    memusg = memusg + (total / sampled) * count
end
return memusg
"""


# asynq's CurrentStats (internal/rdb/inspect.go, spec 3.4): what asynqmon's queue pages and
# `asynq stats` read per queue, every key by name.
GO_CURRENT_STATS = """
local res = {}
local pendingTaskCount = redis.call("LLEN", KEYS[1])
table.insert(res, KEYS[1])
table.insert(res, pendingTaskCount)
table.insert(res, KEYS[2])
table.insert(res, redis.call("LLEN", KEYS[2]))
for i = 3, 6 do
    table.insert(res, KEYS[i])
    table.insert(res, redis.call("ZCARD", KEYS[i]))
end
for i = 7, 10 do
    local n = 0
    local v = redis.call("GET", KEYS[i])
    if v then n = tonumber(v) end
    table.insert(res, KEYS[i])
    table.insert(res, n)
end
table.insert(res, KEYS[11])
table.insert(res, redis.call("EXISTS", KEYS[11]))
table.insert(res, "oldest_pending_since")
if pendingTaskCount > 0 then
    local id = redis.call("LRANGE", KEYS[1], -1, -1)[1]
    table.insert(res, redis.call("HGET", ARGV[1] .. id, "pending_since"))
else
    table.insert(res, 0)
end
local group_names = redis.call("SMEMBERS", KEYS[12])
table.insert(res, "group_size")
table.insert(res, table.getn(group_names))
local aggregating_count = 0
for _, gname in ipairs(group_names) do
    aggregating_count = aggregating_count + redis.call("ZCARD", ARGV[2] .. gname)
end
table.insert(res, "aggregating_count")
table.insert(res, aggregating_count)
return res
"""


async def go_current_stats(r: Redis, queue: str, day: str) -> dict[str, int]:
    """asynq's CurrentStats of *queue*, by key suffix (``pending``, ``processed:<day>``...)."""
    q = p(queue)
    names = ["pending", "active", "scheduled", "retry", "archived", "completed"]
    names += [f"processed:{day}", f"failed:{day}", "processed", "failed", "paused", "groups"]
    res = await r.eval(GO_CURRENT_STATS, len(names), *[q + n for n in names], q + "t:", q + "g:")
    pairs = dict(zip(res[::2], res[1::2], strict=True))
    return {
        (k.decode().removeprefix(q) if isinstance(k, bytes) else k): int(v)
        for k, v in pairs.items()
    }


def stats_exp(now: float) -> int:
    return int(now) + DAY90


def today(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")


async def go_dequeue(r: Redis, queue: str) -> bytes | None:
    q = p(queue)
    lease = int(time.time()) + 30
    res: bytes | None = await r.eval(
        GO_DEQUEUE, 4, q + "pending", q + "paused", q + "active", q + "lease", lease, q + "t:"
    )
    return res


async def go_done(r: Redis, msg: GoTask) -> None:
    q = p(msg.queue)
    now = time.time()
    keys_ = [q + "active", q + "lease", q + "t:" + msg.id, q + "processed:" + today(now)]
    keys_.append(q + "processed")
    if msg.unique_key:
        keys_.append(msg.unique_key)
    await r.eval(GO_DONE, len(keys_), *keys_, msg.id, stats_exp(now), MAXI64)


async def go_mark_as_complete(r: Redis, msg: GoTask) -> None:
    q = p(msg.queue)
    now = int(time.time())
    msg.completed_at = now
    keys_ = [q + "active", q + "lease", q + "completed", q + "t:" + msg.id]
    keys_ += [q + "processed:" + today(now), q + "processed"]
    if msg.unique_key:
        keys_.append(msg.unique_key)
    args = [msg.id, stats_exp(now), now + msg.retention, msg.encode(), MAXI64]
    await r.eval(GO_MARK_AS_COMPLETE, len(keys_), *keys_, *args)


async def go_retry(r: Redis, msg: GoTask, err: str, *, is_failure: bool) -> int:
    q = p(msg.queue)
    now = int(time.time())
    if is_failure:
        msg.retried += 1
    msg.error_msg = err
    msg.last_failed_at = now
    keys_ = [q + "t:" + msg.id, q + "active", q + "lease", q + "retry"]
    keys_ += [q + "processed:" + today(now), q + "failed:" + today(now)]
    keys_ += [q + "processed", q + "failed"]
    retry_at = now + 60
    args = [msg.id, msg.encode(), retry_at, stats_exp(now), "1" if is_failure else "0", MAXI64]
    await r.eval(GO_RETRY, len(keys_), *keys_, *args)
    return retry_at


async def go_forward(r: Redis, queue: str, source: str) -> int:
    q = p(queue)
    now = time.time()
    n: int = await r.eval(
        GO_FORWARD, 2, q + source, q + "pending", int(now), q + "t:", int(now * 1e9), q + "g:"
    )
    return n


async def go_memory_usage(r: Redis, queue: str) -> int:
    """Released asynq's memory-usage script; raises ResponseError where asynqmon would break."""
    q = p(queue)
    keys_ = [q + s for s in ("active", "pending", "scheduled", "retry", "archived", "completed")]
    keys_.append(q + "groups")
    res: int = await r.eval(GO_MEMORY_USAGE_RELEASED, 7, *keys_, q + "t:", 20, 5, q + "g:")
    return res


async def assert_go_readable(r: Redis, queue: str) -> None:
    """Every ID in every structure of *queue* has a hash with msg and the matching state,
    and released asynq's memory-usage script (asynqmon, ``asynq stats``) does not fail."""
    q = p(queue)

    async def check(ids: list[bytes], where: str, state: str) -> None:
        for raw in ids:
            tid = raw.decode()
            fields = await r.hmget(q + "t:" + tid, "msg", "state")
            assert fields[0] is not None, f"{where} holds {tid} without a task hash/msg"
            assert fields[1] == state.encode(), f"{where}: {tid} has state {fields[1]!r}"

    await check(await r.lrange(q + "pending", 0, -1), "pending", "pending")
    await check(await r.lrange(q + "active", 0, -1), "active", "active")
    await check(await r.zrange(q + "lease", 0, -1), "lease", "active")
    for s in ("scheduled", "retry", "archived", "completed"):
        await check(await r.zrange(q + s, 0, -1), s, s)
    for g in await r.smembers(q + "groups"):
        gkey = q + "g:" + g.decode()
        members = await r.zrange(gkey, 0, -1)
        assert members, f"group {g!r} is listed in groups but empty"
        await check(members, gkey, "aggregating")
    for skey in await r.zrange(q + "aggregation_sets", 0, -1):
        await check(await r.zrange(skey, 0, -1), skey.decode(), "aggregating")
    assert await go_memory_usage(r, queue) > 0


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture
async def insp(redis: Redis) -> AsyncIterator[Inspector]:
    async with Inspector(redis) as i:
        yield i


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


async def msg_of(r: Redis, queue: str, task_id: str) -> GoTask:
    raw = await r.hget(p(queue) + "t:" + task_id, "msg")
    assert raw is not None, f"task {task_id} has no msg"
    return GoTask.decode(raw)


async def assert_daily_counter(r: Redis, key: str, value: int) -> None:
    assert await r.get(key) == str(value).encode(), key
    ttl = await r.ttl(key)
    assert DAY90 - 120 <= ttl <= DAY90, f"{key} expires in {ttl}s, not 90 days"


# -- Go-written tasks through an asyncq Server ------------------------------------------------


async def test_go_enqueued_tasks_processed_by_asyncq_server_leave_go_state(redis: Redis) -> None:
    now = datetime.now(UTC)
    started = int(time.time())
    ok = GoTask("ok", b"1", headers={"trace": "t1"})
    uniq = GoTask("ok", b"2", unique_key=p("default") + "unique:ok:" + md5(b"2"))
    keep = GoTask("keep", b"3", retention=3600)
    revoke = GoTask("revoke", b"4")
    fail = GoTask("fail", b"5", retry=3)
    skip = GoTask("skip", b"6", retried=1)
    for t in (ok, uniq, keep, revoke, fail, skip):
        await go.enqueue(redis, t, now)
    assert await redis.get(uniq.unique_key) == uniq.id.encode()

    async def handle(task: Task) -> None:
        if task.type == "revoke":
            raise RevokeTask()
        if task.type == "fail":
            raise ValueError("boom")
        if task.type == "skip":
            raise SkipRetry("no point")

    mux = ServeMux()
    for name in ("ok", "keep", "revoke", "fail", "skip"):
        mux.handle(name, handle)
    q = p("default")
    async with Server(redis, concurrency=4, **FAST) as server:
        await server.start(mux)

        async def drained() -> bool:
            return await redis.llen(q + "pending") == 0 and await redis.llen(q + "active") == 0

        await wait_until(drained, what="queue drained")
        # Recovery must not touch anything: nothing is left behind in active/lease.
        assert await redis.zcard(q + "lease") == 0
    finished = time.time()

    for t in (ok, uniq, revoke):
        assert not await redis.exists(t.key), f"{t.type} task hash should be deleted (Done)"
    assert not await redis.exists(uniq.unique_key), "Done releases the unique lock"

    stored = await msg_of(redis, "default", keep.id)
    assert await redis.hget(keep.key, "state") == b"completed"
    assert started - 1 <= stored.completed_at <= finished + 1
    assert await redis.zscore(q + "completed", keep.id) == stored.completed_at + 3600
    assert stored.retried == 0 and stored.error_msg == "" and stored.last_failed_at == 0

    stored = await msg_of(redis, "default", fail.id)
    assert await redis.hget(fail.key, "state") == b"retry"
    assert stored.retried == 1 and stored.retry == 3
    assert "boom" in stored.error_msg
    assert started - 1 <= stored.last_failed_at <= finished + 1
    # DefaultRetryDelayFunc(0) waits 15-44 s.
    score = await redis.zscore(q + "retry", fail.id)
    assert score is not None and stored.last_failed_at + 15 <= score <= stored.last_failed_at + 45

    stored = await msg_of(redis, "default", skip.id)
    assert await redis.hget(skip.key, "state") == b"archived"
    assert stored.retried == 1, "Archive does not increment retried"
    assert stored.error_msg == "no point"
    assert started - 1 <= stored.last_failed_at <= finished + 1
    assert await redis.zscore(q + "archived", skip.id) is not None

    # Every task counts as processed; fail and skip also as failed (revoke does not).
    day = today(finished)
    await assert_daily_counter(redis, q + "processed:" + day, 6)
    await assert_daily_counter(redis, q + "failed:" + day, 2)
    assert await redis.get(q + "processed") == b"6"
    assert await redis.get(q + "failed") == b"2"
    # The Go message bytes asyncq rewrote keep Go's field set (headers survive).
    assert (await msg_of(redis, "default", keep.id)).payload == b"3"
    await assert_go_readable(redis, "default")


async def test_history_and_progress_keys_leave_asynqmons_reads_unchanged(redis: Redis) -> None:
    """asynqmon lists queues from ``asynq:queues`` and reads each queue's keys by name
    (CurrentStats, memory usage, daily stats, the task hashes). The metrics history
    (``asynq:{q}:asyncq:metrics:<minute>``) and progress (``asyncq:{q}:progress:<id>``)
    keys add no queue, sit under no name Go reads, and leave those reads' answers as
    they would be without them."""
    release = asyncio.Event()
    reported = asyncio.Event()

    async def handle(task: Task) -> None:
        if task.type == "hold":
            asyncq.progress(0.5, "half way")
            reported.set()
            await release.wait()
        elif task.type == "fail":
            raise SkipRetry("no")

    mux = ServeMux()
    for name in ("ok", "hold", "fail"):
        mux.handle(name, handle)
    now = datetime.now(UTC)
    for i in range(3):
        await go.enqueue(redis, GoTask("ok", bytes([i])), now)
    await go.enqueue(redis, GoTask("fail", b"f", queue="mail"), now)
    hold = GoTask("hold", b"h")
    await go.enqueue(redis, hold, now)
    async with Server(
        redis, concurrency=4, queues={"default": 1, "mail": 1}, metrics_history=True, **FAST
    ) as server:
        await server.start(mux)
        await asyncio.wait_for(reported.wait(), 30)

        async def settled() -> bool:
            return (
                await redis.llen(p("default") + "pending") == 0
                and await redis.llen(p("default") + "active") == 1
                and await redis.zcard(p("mail") + "archived") == 1
                and await redis.exists(f"asyncq:{{default}}:progress:{hold.id}") == 1
            )

        await wait_until(settled, what="three done, one archived, one running with progress")
        assert server.history is not None
        await server.history.flush()
        minute_keys = [k async for k in redis.scan_iter(match="asynq:{*}:asyncq:metrics:*")]
        assert {k.split(b"}")[0] for k in minute_keys} == {b"asynq:{default", b"asynq:{mail"}

        # what asynqmon's queue list and queue pages read
        assert await redis.smembers("asynq:queues") == {b"default", b"mail"}
        day = now.strftime("%Y-%m-%d")
        stats = await go_current_stats(redis, "default", day)
        assert stats == {
            "pending": 0, "active": 1, "scheduled": 0, "retry": 0, "archived": 0,
            "completed": 0, f"processed:{day}": 3, f"failed:{day}": 0, "processed": 3,
            "failed": 0, "paused": 0, "oldest_pending_since": 0, "group_size": 0,
            "aggregating_count": 0,
        }  # fmt: skip
        mail = await go_current_stats(redis, "mail", day)
        assert (mail["archived"], mail[f"processed:{day}"], mail[f"failed:{day}"]) == (1, 1, 1)
        for queue in ("default", "mail"):
            await assert_go_readable(redis, queue)
        # the running task's hash holds Go's fields only; its progress lives apart
        assert set(await redis.hkeys(hold.key)) <= {
            b"msg",
            b"state",
            b"pending_since",
            b"result",
            b"completed_at",
            b"group",
        }
        # no key of a queue is named as one Go reads but holds something else
        go_names = ("t:", "g:", "unique:", "processed", "failed", "lease", "groups")
        go_names += ("pending", "active", "scheduled", "retry", "archived", "completed")
        go_names += ("paused", "aggregation_sets", "servers", "workers")
        for key in await redis.keys("asynq:{*}:*"):
            rest = key.decode().split("}:", 1)[1]
            asyncq_names = ("asyncq:metrics:", "asyncq:waiters")
            assert rest.startswith(go_names) or rest.startswith(asyncq_names), key
            if rest.startswith("asyncq:"):
                # metrics history (hashes), idle servers waiting for direct delivery (a list)
                kind = b"list" if rest == "asyncq:waiters" else b"hash"
                assert await redis.type(key) == kind and await redis.ttl(key) > 0

        # Go's RemoveQueue takes a queue out of asynq:queues: a later flush of its
        # history must not list it again
        await redis.srem("asynq:queues", "mail")
        await go.enqueue(redis, GoTask("ok", b"after"), now)
        await wait_until(
            lambda: _llen_zero(redis, p("default") + "pending"), what="the late task done"
        )
        ended = time.time()  # a run that failed and was archived
        server.history.record("mail", "fail", ended - 0.01, ended, True, False, True)
        await server.history.flush()
        assert await redis.smembers("asynq:queues") == {b"default"}
        release.set()
    assert await redis.exists(f"asyncq:{{default}}:progress:{hold.id}") == 0


async def _llen_zero(r: Redis, key: str) -> bool:
    return await r.llen(key) == 0


# -- asyncq-written tasks through a simulated Go server ---------------------------------------


async def test_asyncq_enqueued_tasks_consumed_by_go_dequeue_and_done(
    redis: Redis, client: Client, insp: Inspector
) -> None:
    plain = await client.enqueue(Task("email", b"hello", headers={"h": "v"}))
    uniq = await client.enqueue(Task("email", b"once"), unique=timedelta(hours=1))
    keep = await client.enqueue(Task("report", None), retention=timedelta(hours=2))
    flaky = await client.enqueue(Task("flaky", b"x"), max_retry=5, timeout=timedelta(seconds=90))
    q = p("default")
    assert await redis.sismember("asynq:queues", "default")

    # Byte-for-byte what Go's client writes for the same task.
    ukey = q + "unique:email:" + md5(b"once")
    expected = {
        plain.id: GoTask("email", b"hello", id=plain.id, headers={"h": "v"}),
        uniq.id: GoTask("email", b"once", id=uniq.id, unique_key=ukey),
        keep.id: GoTask("report", b"", id=keep.id, retention=7200),
        flaky.id: GoTask("flaky", b"x", id=flaky.id, retry=5, timeout=90),
    }
    for tid, gt in expected.items():
        h = await redis.hgetall(q + "t:" + tid)
        assert h[b"msg"] == gt.encode()
        assert h[b"state"] == b"pending"
        assert abs(int(h[b"pending_since"]) / 1e9 - time.time()) < 60, "pending_since is in ns"
    assert await redis.hget(q + "t:" + uniq.id, "unique_key") == ukey.encode()
    assert await redis.get(ukey) == uniq.id.encode()
    assert 3590 <= await redis.ttl(ukey) <= 3600

    # A Go server takes them oldest first (RPOPLPUSH from the tail).
    taken: list[GoTask] = []
    while (raw := await go_dequeue(redis, "default")) is not None:
        taken.append(GoTask.decode(raw))
    assert [m.id for m in taken] == [plain.id, uniq.id, keep.id, flaky.id]
    for m in taken:
        assert await redis.hget(q + "t:" + m.id, "pending_since") is None

    by_id = {m.id: m for m in taken}
    await go_done(redis, by_id[plain.id])
    await go_done(redis, by_id[uniq.id])
    await go_mark_as_complete(redis, by_id[keep.id])
    retry_at = await go_retry(redis, by_id[flaky.id], "transient", is_failure=True)

    assert not await redis.exists(ukey)
    now = time.time()
    await assert_daily_counter(redis, q + "processed:" + today(now), 4)
    await assert_daily_counter(redis, q + "failed:" + today(now), 1)

    # asyncq's Inspector reads what the Go server left.
    done = await insp.get_task("default", keep.id)
    assert done.state is TaskState.COMPLETED and done.completed_at is not None
    again = await insp.get_task("default", flaky.id)
    assert again.state is TaskState.RETRY and again.retried == 1
    assert again.last_error == "transient"
    assert again.next_process_at == datetime.fromtimestamp(retry_at, UTC)
    info = await insp.queue_info("default")
    assert (info.processed, info.failed, info.completed, info.retry) == (4, 1, 1, 1)
    await assert_go_readable(redis, "default")


async def test_asyncq_scheduled_and_grouped_tasks_forwarded_by_go(
    redis: Redis, client: Client
) -> None:
    later = await client.enqueue(Task("later", b"1"), process_in=timedelta(hours=1))
    grouped_later = await client.enqueue(
        Task("later", b"2"), process_in=timedelta(hours=1), group="g1"
    )
    member = await client.enqueue(Task("agg", b"3"), group="g1")
    q = p("default")
    # Scheduling wins over grouping; only AddToGroup writes the group field.
    assert await redis.hget(q + "t:" + grouped_later.id, "group") is None
    assert await redis.hget(q + "t:" + member.id, "group") == b"g1"
    assert await redis.smembers(q + "groups") == {b"g1"}
    assert await redis.zscore(q + "g:g1", member.id) is not None

    # Time passes: a Go forwarder moves both scheduled tasks to pending.
    await redis.zadd(q + "scheduled", {later.id: 1, grouped_later.id: 1})
    assert await go_forward(redis, "default", "scheduled") == 2
    assert set(await redis.lrange(q + "pending", 0, -1)) == {
        later.id.encode(),
        grouped_later.id.encode(),
    }
    await assert_go_readable(redis, "default")


# -- released asynq's memory-usage script over asyncq's own paths -----------------------------


async def test_go_memory_usage_never_breaks_on_what_asyncq_leaves(
    redis: Redis, client: Client, insp: Inspector
) -> None:
    now = time.time()
    dt = datetime.fromtimestamp(now, UTC)
    broker = Broker(redis)
    q = p("default")

    # Go's own half-written leftovers that asyncq runs into: ids without hashes.
    await go.register_queue(redis, "default")
    await redis.lpush(q + "pending", "ghost-pending")
    # Old and surplus archived tasks, which archiving trims.
    old = [GoTask("old", bytes([i])) for i in range(3)]
    for t in old:
        await go.seed_archived(redis, t, dt - timedelta(days=91))
    # A pending task whose message cannot be decoded.
    await redis.hset(q + "t:bad", mapping={"msg": b"\xff\xff", "state": "pending"})
    await redis.lpush(q + "pending", "bad")

    good = await client.enqueue(Task("work", b"w"))
    got = await transitions.dequeue_many(broker, ["default"], 5)
    assert [d.message.id for d in got] == [good.id]
    assert await redis.hget(q + "t:bad", "state") == b"archived"
    await assert_go_readable(redis, "default")

    await broker.archive(got[0].message, "gave up")
    for t in old:
        assert not await redis.exists(t.key)
    await redis.zadd(q + "retry", {"ghost-retry": 1})
    await transitions.forward_if_ready(broker, ["default"])
    assert await redis.zcard(q + "retry") == 0
    assert await redis.llen(q + "pending") == 0
    await assert_go_readable(redis, "default")

    # Aggregation with an undecodable member, then reclaim and re-aggregate.
    a = await client.enqueue(Task("agg", b"a"), group="g")
    await redis.hset(q + "t:undecodable", mapping={"msg": b"\x0a", "state": "aggregating"})
    await redis.hset(q + "t:undecodable", "group", "g")
    await redis.zadd(q + "g:g", {"undecodable": int(now)})
    # Checked a second on: members are scored in whole seconds of the enqueue time,
    # which may be past `dt` when the test crossed a second boundary.
    later = datetime.now(UTC) + timedelta(seconds=1)
    set_id = await broker.aggregation_check("default", "g", later, 0, 0, 0)
    assert set_id is not None
    await assert_go_readable(redis, "default")
    msgs, _ = await broker.read_aggregation_set("default", "g", set_id)
    assert [m.id for m in msgs] == [a.id]
    await assert_go_readable(redis, "default")
    await broker.delete_aggregation_set("default", "g", set_id)
    assert not await redis.exists(q + "t:" + a.id)
    await assert_go_readable(redis, "default")

    # Inspector bulk operations with trimming and unique locks.
    for i in range(3):
        await client.enqueue(Task("x", bytes([i])), unique=timedelta(minutes=5))
    await client.enqueue(Task("x", b"s"), process_in=timedelta(hours=1))
    assert await insp.archive_all("default", "pending") == 3
    assert await insp.run_all("default", "archived") >= 3
    assert await insp.delete_all("default", "pending") >= 3
    await assert_go_readable(redis, "default")


# -- unique locks: which paths release them (spec 2.4, gotcha 8) -----------------------------


async def test_unique_lock_kept_by_retry_archive_requeue_released_by_done(
    redis: Redis, client: Client, insp: Inspector
) -> None:
    q = p("default")
    ukey = q + "unique:u:" + md5(b"p")
    t = GoTask("u", b"p", unique_key=ukey)
    await go.enqueue(redis, t, datetime.now(UTC))
    broker = Broker(redis)

    async def take() -> Any:
        got = await transitions.dequeue(broker, ["default"])
        assert got is not None and got.message.id == t.id
        return got.message

    msg = await take()
    await broker.retry(msg, datetime.now(UTC) - timedelta(seconds=1), "e", is_failure=True)
    assert await redis.get(ukey) == t.id.encode(), "Retry keeps the lock"
    await transitions.forward_if_ready(broker, ["default"])
    msg = await take()
    await broker.requeue(msg)
    assert await redis.get(ukey) == t.id.encode(), "Requeue keeps the lock"
    msg = await take()
    await broker.archive(msg, "e")
    assert await redis.get(ukey) == t.id.encode(), "Archive keeps the lock"
    await insp.run_task("default", t.id)
    msg = await take()
    await broker.done(msg)
    assert not await redis.exists(ukey), "Done releases the lock"

    # AddToGroupUnique takes the lock but writes no unique_key hash field.
    grouped = await client.enqueue(Task("u", b"g"), group="grp", unique=timedelta(minutes=1))
    assert await redis.get(q + "unique:u:" + md5(b"g")) == grouped.id.encode()
    assert await redis.hget(q + "t:" + grouped.id, "unique_key") is None
    # EnqueueUnique whose ID conflicts keeps the lock it just took.
    with pytest.raises(TaskIdConflictError):
        await client.enqueue(Task("u", b"c"), unique=timedelta(minutes=1), task_id=grouped.id)
    assert await redis.get(q + "unique:u:" + md5(b"c")) == grouped.id.encode()


# -- heartbeat records as Go's ListServers / ListWorkers read them ----------------------------


GO_LIST_SERVER_KEYS = """
local now = tonumber(ARGV[1])
local keys = redis.call("ZRANGEBYSCORE", KEYS[1], now, "+inf")
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - 1)
return keys
"""


async def test_asyncq_server_heartbeat_as_go_list_servers_reads_it(redis: Redis) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def handle(task: Task) -> None:
        started.set()
        await release.wait()

    mux = ServeMux()
    mux.handle("hold", handle)
    server = Server(
        redis,
        concurrency=2,
        queues={"critical": 6, "low": 2},
        strict_priority=True,
        intervals=Intervals(heartbeat=timedelta(milliseconds=300)),
    )
    before = int(time.time())
    async with Client(redis) as c, server:
        await server.start(mux)
        info = await c.enqueue(Task("hold", b"pl"), queue="critical")
        await started.wait()
        now = int(time.time())

        async def live(index: str) -> list[bytes]:
            res: list[bytes] = await redis.eval(GO_LIST_SERVER_KEYS, 1, index, now)
            return res

        async def worker_written() -> bool:
            return len(await redis.hvals((await live("asynq:workers"))[0])) == 1

        await wait_until(worker_written, within=15, what="worker record")
        [skey] = await live("asynq:servers")
        assert skey.decode() == f"asynq:servers:{{{server.host}:{server.pid}:{server.server_id}}}"
        assert 0 < await redis.ttl(skey) <= 10
        f = go.fields_by_number(await redis.get(skey))
        assert f[1] == [server.host.encode()] and f[2] == [server.pid]
        assert f[3] == [server.server_id.encode()] and f[4] == [2]
        queues = {}
        for entry in f[5]:
            assert isinstance(entry, bytes)
            e = go.fields_by_number(entry)
            key = e[1][0]
            assert isinstance(key, bytes)
            queues[key.decode()] = e[2][0]
        assert queues == {"critical": 6, "low": 2}  # configured, not divided by their GCD
        assert f[6] == [1] and f[7] == [b"active"]
        start = f[8][0]
        assert isinstance(start, bytes)
        assert before - 1 <= go.signed64(go.fields_by_number(start)[1][0]) <= now + 1
        assert f[9] == [1]

        [wkey] = await live("asynq:workers")
        assert 0 < await redis.ttl(wkey) <= 10
        [raw] = await redis.hvals(wkey)
        w = go.fields_by_number(raw)
        assert w[3] == [server.server_id.encode()]  # how Go joins workers to servers
        assert w[4] == [info.id.encode()] and w[5] == [b"hold"] and w[6] == [b"pl"]
        assert w[7] == [b"critical"]
        w_start, w_deadline = w[8][0], w[9][0]
        assert isinstance(w_start, bytes) and isinstance(w_deadline, bytes)
        begun = go.signed64(go.fields_by_number(w_start)[1][0])
        assert before - 1 <= begun <= now + 1
        # No timeout or deadline given: the client's 30 min default timeout.
        assert go.signed64(go.fields_by_number(w_deadline)[1][0]) - begun in range(1799, 1801)
        release.set()


# -- discrepancies found by this audit --------------------------------------------------------


@pytest.fixture
async def acl_user(redis: Redis, redis_url: str) -> AsyncIterator[str]:
    """A Redis 7 ACL user that may run every command on every key but use no Pub/Sub
    channel: the default for users made with ``ACL SETUSER`` (``acl-pubsub-default
    resetchannels``). Go asynq's client and worker scripts never publish, so they work."""
    async with temporary_acl_user(redis, redis_url, "audit", "~*", "+@all", "resetchannels") as url:
        yield url


async def test_wakeup_publish_denied_by_acl_does_not_fail_writes(
    redis: Redis, acl_user: str
) -> None:
    """asyncq's wake-up PUBLISH is an optimisation: when ACLs forbid it, the write it rides
    on must still succeed (the script already wrote; an error would make callers retry and
    enqueue the task twice)."""
    q = p("default")
    async with Client(acl_user) as c:
        info = await c.enqueue(Task("t", b"1"))
        await c.enqueue(Task("t", b"2"), unique=timedelta(minutes=1))
        later = await c.enqueue(Task("t", b"3"), process_in=timedelta(hours=1))
        assert await redis.llen(q + "pending") == 2
        broker = c.broker
        got = await transitions.dequeue(broker, ["default"])
        assert got is not None and got.message.id == info.id
        await redis.delete(q + "pending")
        await broker.requeue(got.message)  # pending was empty: it publishes
        assert await redis.lrange(q + "pending", 0, -1) == [info.id.encode()]
        await redis.delete(q + "pending")
        await redis.zadd(q + "scheduled", {later.id: 1})
        assert await transitions.forward_if_ready(broker, ["default"]) == 1
    async with Inspector(acl_user) as i:
        await redis.zadd(q + "scheduled", {later.id: 1})
        await redis.hset(q + "t:" + later.id, "state", "scheduled")
        await redis.lrem(q + "pending", 0, later.id)
        await i.run_task("default", later.id)
        await i.pause("default")
        await i.resume("default")
        assert await i.run_all("default", "scheduled") == 0


async def test_update_payload_refuses_an_undecodable_message(redis: Redis, insp: Inspector) -> None:
    """The Inspector shows an undecodable message as a placeholder; rewriting the payload
    must not replace the stored bytes by that placeholder (Go's UpdateTaskPayload fails to
    decode and changes nothing)."""
    q = p("default")
    await go.register_queue(redis, "default")
    raw = b"\xff\xff\xff"
    await redis.hset(q + "t:odd", mapping={"msg": raw, "state": "scheduled"})
    await redis.zadd(q + "scheduled", {"odd": int(time.time()) + 3600})
    with pytest.raises(FailedPreconditionError, match="cannot be decoded"):
        await insp.update_task_payload("default", "odd", b"new")
    assert await redis.hget(q + "t:odd", "msg") == raw
