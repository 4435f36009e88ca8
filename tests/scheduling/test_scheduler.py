"""Scheduler: asynq's heartbeat and history records, hooks, and exactly-once ticks."""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._gofmt import parse_option_strings
from asyncq._inspection.inspector import Inspector
from asyncq._producer.client import Client
from asyncq._scheduling.cron import parse_cronspec
from asyncq._scheduling.scheduler import (
    EntryNotFoundError,
    Scheduler,
    entry_identity,
    tick_task_id,
)
from asyncq._time import GO_ZERO_TIME
from asyncq.errors import DuplicateTaskError
from asyncq.proto.asynq import SchedulerEnqueueEvent, SchedulerEntry, TaskMessage
from asyncq.task import Task, TaskInfo
from tests.support.helpers import wait_until
from tests.support.redis_server import free_port

FAST = {
    "heartbeat_interval": timedelta(seconds=1),
    "claim_lease": timedelta(milliseconds=500),
}


async def entries_of(redis: Redis, scheduler: Scheduler) -> list[SchedulerEntry]:
    raw = await redis.lrange(f"asynq:schedulers:{{{scheduler.id}}}", 0, -1)
    return [SchedulerEntry.parse(b) for b in raw]


async def test_heartbeat_writes_scheduler_entries_like_asynq(redis: Redis, redis_url: str) -> None:
    scheduler = Scheduler(redis_url, heartbeat_interval=timedelta(seconds=3))
    digest = Task("email:digest", b'{"user":1}')
    first = scheduler.register(
        "*/5 * * * *", digest, queue="critical", max_retry=3, timeout=timedelta(minutes=30)
    )
    cleanup = Task("cleanup", headers={"h": "v"}, queue="low")
    second = scheduler.register(
        "CRON_TZ=Europe/Berlin 0 3 * * *",
        cleanup,
        unique=timedelta(hours=1),
        deadline=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
        headers={"trace": "on"},
    )
    host, pid, uid = scheduler.id.split(":")
    assert host == socket.gethostname() and pid == str(os.getpid()) and len(uid) == 36

    before = time.time()
    async with scheduler:
        # Written at start, without waiting one interval.
        key = f"asynq:schedulers:{{{scheduler.id}}}"
        assert 0 < await redis.ttl(key) <= 6  # 2 x heartbeat interval
        score = await redis.zscore("asynq:schedulers", key)
        assert score is not None and before + 5 <= score <= time.time() + 6
        entries = await entries_of(redis, scheduler)
        # LPUSHed one by one, so the list holds them in reverse.
        assert [e.id for e in entries] == [second, first]
        by_id = {e.id: e for e in entries}

        e1 = by_id[first]
        assert e1.spec == "*/5 * * * *"
        assert e1.task_type == "email:digest"
        assert e1.task_payload == b'{"user":1}'
        assert e1.enqueue_options == ['Queue("critical")', "MaxRetry(3)", "Timeout(30m0s)"]
        # The next run after the heartbeat, whichever side of a 5-minute boundary that
        # fell: a match of the spec, no earlier than the one due after `before`.
        cron = parse_cronspec("*/5 * * * *")
        nxt = e1.next_enqueue_time
        assert cron.next_after(datetime.fromtimestamp(before, UTC)) <= nxt
        assert cron.next_after(nxt - timedelta(seconds=1)) == nxt
        assert nxt <= cron.next_after(datetime.now(UTC))
        # Never enqueued: Go's zero time, which the asynq CLI prints as "N/A".
        assert e1.prev_enqueue_time == GO_ZERO_TIME
        assert b"\x08\x80\x92\xb8\xc3\x98\xfe\xff\xff\xff\x01" in bytes(e1)  # -62135596800

        e2 = by_id[second]
        assert e2.spec == "CRON_TZ=Europe/Berlin 0 3 * * *"
        assert e2.task_payload == b""
        # The task's default options come first; datetimes are written in UTC.
        assert e2.enqueue_options == [
            'Queue("low")',
            "Unique(1h0m0s)",
            "Deadline(Wed Jan  2 03:04:05 UTC 2030)",
            'Header(["trace","on"])',
        ]
        assert e2.next_enqueue_time is not None
        assert e2.next_enqueue_time.astimezone(parse_cronspec(e2.spec).location).hour == 3

    assert await redis.exists(key) == 0
    assert await redis.zscore("asynq:schedulers", key) is None


async def test_ticks_enqueue_tasks_and_record_history(redis: Redis, redis_url: str) -> None:
    pre: list[tuple[Task, dict[str, Any]]] = []
    post: list[tuple[TaskInfo | None, BaseException | None]] = []

    async def pre_hook(task: Task, options: dict[str, Any]) -> None:
        pre.append((task, options))

    def post_hook(info: TaskInfo | None, exc: BaseException | None) -> None:
        post.append((info, exc))

    task = Task("report", b"payload", max_retry=2)
    scheduler = Scheduler(redis_url, pre_enqueue=pre_hook, post_enqueue=post_hook, **FAST)
    entry_id = scheduler.register("@every 1s", task, queue="reports")
    identity = entry_identity("@every 1s", task, {"queue": "reports"})
    history = f"asynq:scheduler_history:{entry_id}"
    started = int(time.time())
    async with scheduler:
        await wait_until(lambda: len(post) >= 2)
        await wait_until(lambda: redis.zcard(history))

        # Each tick's task ID is derived from (entry identity, tick time).
        for (info, exc), (hooked_task, options) in zip(post, pre, strict=False):
            assert exc is None and info is not None
            assert hooked_task is task
            assert options == {"queue": "reports", "task_id": info.id}
            msg = TaskMessage.parse(await redis.hget(f"asynq:{{reports}}:t:{info.id}", "msg"))
            assert (msg.type, msg.payload, msg.queue, msg.retry) == (
                "report",
                b"payload",
                "reports",
                2,
            )
            assert await redis.hget(f"asynq:{{reports}}:t:{info.id}", "state") == b"pending"

        # Every tick of the run, bracketed by observed times rather than a margin.
        ticks = {tick_task_id(identity, t): t for t in range(started, int(time.time()) + 2)}
        for info, _ in post:
            assert info is not None and info.id in ticks
            claim = await redis.get(keys.scheduler_claim_key(identity, ticks[info.id]))
            assert claim == f"done:{scheduler.id}:{info.id}".encode()

        events = await redis.zrange(history, 0, -1, withscores=True)
        assert events
        assert await redis.ttl(history) == -1  # asynq gives histories no TTL
        for member, score in events:
            event = SchedulerEnqueueEvent.parse(member)
            assert event.enqueue_time is not None
            assert score == int(event.enqueue_time.timestamp())
            assert event.task_id in {info.id for info, _ in post if info is not None}

        # What `asynq cron ls` / `cron history` read back (asyncq's Inspector).
        async with Inspector(redis) as inspector:
            (listed,) = await inspector.scheduler_entries()
            assert (listed.id, listed.spec, listed.task_type) == (entry_id, "@every 1s", "report")
            assert parse_option_strings(listed.options) == {"max_retry": 2, "queue": "reports"}
            recorded = await inspector.scheduler_enqueue_events(entry_id)
            assert {e.task_id for e in recorded} <= {i.id for i, _ in post if i is not None}

        # The heartbeat reports the last tick as prev and the next one as next.
        async def prev_is_set() -> bool:
            entries = await entries_of(redis, scheduler)
            return bool(entries) and entries[0].prev_enqueue_time != GO_ZERO_TIME

        await wait_until(prev_is_set)
        (entry,) = await entries_of(redis, scheduler)
        assert entry.prev_enqueue_time is not None and entry.next_enqueue_time is not None
        assert entry.prev_enqueue_time.microsecond == 0
        assert entry.next_enqueue_time > entry.prev_enqueue_time

    # asynq deletes every entry's history at shutdown.
    assert await redis.exists(history) == 0


async def test_three_schedulers_enqueue_each_tick_exactly_once(
    redis: Redis, redis_url: str
) -> None:
    attempts: list[str] = []
    enqueued: list[str] = []
    refused: list[BaseException] = []

    def pre_hook(task: Task, options: dict[str, Any]) -> None:
        attempts.append(options["task_id"])

    def post_hook(info: TaskInfo | None, exc: BaseException | None) -> None:
        if exc is None and info is not None:
            enqueued.append(info.id)
        else:
            refused.append(exc or AssertionError("no TaskInfo and no error"))

    task = Task("heartbeat:ping", b"x")
    schedulers = [
        Scheduler(redis_url, pre_enqueue=pre_hook, post_enqueue=post_hook, **FAST) for _ in range(3)
    ]
    for s in schedulers:
        s.register("@every 1s", task)
    identity = entry_identity("@every 1s", task, {})
    start = int(time.time())
    for s in schedulers:
        await s.start()
    try:
        await wait_until(lambda: len(enqueued) >= 5)
        histories = [f"asynq:scheduler_history:{eid}" for s in schedulers for eid in s.entries]

        async def all_recorded() -> bool:
            return sum([await redis.zcard(h) for h in histories]) == len(enqueued)

        await wait_until(all_recorded)
    finally:
        for s in schedulers:
            await s.shutdown()
    end = int(time.time())

    # Exactly once is about ticks enqueued, not attempts: under load a claim can run out
    # while its holder is slow, and the scheduler taking it over attempts the tick again
    # (the pre-enqueue hook runs again); that attempt must find the task already there
    # (TaskIdConflictError, handled inside the scheduler), never enqueue it a second time.
    assert Counter(enqueued).most_common(1)[0][1] == 1, "a tick was enqueued twice"
    assert set(attempts) == set(enqueued), "a tick was attempted but never enqueued"
    assert refused == []
    # Every tick in the run was enqueued, by exactly one of the three.
    by_tick = {tick_task_id(identity, t): t for t in range(start, end + 1)}
    ticks = sorted(by_tick[i] for i in enqueued)
    assert ticks == list(range(ticks[0], ticks[-1] + 1))
    assert await redis.llen("asynq:{default}:pending") == len(enqueued)


async def test_a_dead_claimant_is_taken_over(redis: Redis, redis_url: str) -> None:
    task = Task("takeover")
    identity = entry_identity("@every 1s", task, {})
    enqueued: list[str] = []
    scheduler = Scheduler(
        redis_url, post_enqueue=lambda info, exc: enqueued.append(info.id) if info else None, **FAST
    )
    scheduler.register("@every 1s", task)
    # A scheduler that died right after claiming the next two ticks; for the
    # second it had even enqueued the task before dying. Its claims have the shape
    # and the lease a live claimant's have, and lapse 1.5 s after their ticks.
    t1 = int(time.time()) + 2
    t2 = t1 + 1
    lapse = {t: t + 1.5 for t in (t1, t2)}
    for t in (t1, t2):
        px = int((lapse[t] - time.time()) * 1000)
        await redis.set(keys.scheduler_claim_key(identity, t), "dead:1:x/entry", px=px)
    async with Client(redis) as client:
        await client.enqueue(task, task_id=tick_task_id(identity, t2))

    async with scheduler:
        for t in (t1, t2):
            await wait_until(lambda t=t: _done(redis, identity, t), within=20)
            # Taken over only once the dead claimant's lease ran out (the claim is a
            # SET of a missing key), by construction: never while it was held.
            assert time.time() >= lapse[t]
    claim1 = await redis.get(keys.scheduler_claim_key(identity, t1))
    claim2 = await redis.get(keys.scheduler_claim_key(identity, t2))
    assert claim1 == f"done:{scheduler.id}:{tick_task_id(identity, t1)}".encode()
    assert claim2 == f"done:{scheduler.id}:{tick_task_id(identity, t2)}".encode()
    assert tick_task_id(identity, t1) in enqueued
    assert tick_task_id(identity, t2) not in enqueued  # it was already there: not enqueued again
    ids = await redis.lrange("asynq:{default}:pending", 0, -1)
    assert len(ids) == len(set(ids))
    assert {tick_task_id(identity, t).encode() for t in (t1, t2)} <= set(ids)


async def _done(redis: Redis, identity: str, tick: int) -> bool:
    value = await redis.get(keys.scheduler_claim_key(identity, tick))
    return value is not None and value.startswith(b"done:")


async def test_enqueue_errors_reach_post_hook_and_error_handler(
    redis: Redis, redis_url: str
) -> None:
    post: list[tuple[TaskInfo | None, BaseException | None]] = []
    errors: list[tuple[Task, dict[str, Any], BaseException]] = []

    async def on_error(task: Task, options: dict[str, Any], exc: BaseException) -> None:
        errors.append((task, options, exc))

    task = Task("unique:job")
    scheduler = Scheduler(
        redis_url,
        post_enqueue=lambda info, exc: post.append((info, exc)),
        error_handler=on_error,
        **FAST,
    )
    scheduler.register("@every 1s", task, unique=timedelta(hours=1))
    async with scheduler:
        await wait_until(lambda: len(errors) >= 1)
    # The first tick holds the unique lock; the next one is a duplicate.
    assert post[0][0] is not None and post[0][1] is None
    failed = [exc for info, exc in post if info is None]
    assert failed and all(isinstance(e, DuplicateTaskError) for e in failed)
    task_seen, options, exc = errors[0]
    assert task_seen is task and isinstance(exc, DuplicateTaskError)
    assert options["unique"] == timedelta(hours=1)


async def test_a_failing_pre_hook_skips_the_tick_loudly(redis: Redis, redis_url: str) -> None:
    errors: list[BaseException] = []

    def pre_hook(task: Task, options: dict[str, Any]) -> None:
        raise RuntimeError("veto")

    scheduler = Scheduler(
        redis_url,
        pre_enqueue=pre_hook,
        error_handler=lambda task, options, exc: errors.append(exc),
        **FAST,
    )
    scheduler.register("@every 1s", Task("vetoed"))
    async with scheduler:
        await wait_until(lambda: len(errors) >= 1)
    assert isinstance(errors[0], RuntimeError)
    assert await redis.llen("asynq:{default}:pending") == 0


async def test_register_and_unregister_while_running(redis: Redis, redis_url: str) -> None:
    scheduler = Scheduler(redis_url, heartbeat_interval=timedelta(seconds=30))
    await scheduler.start()
    try:
        # Right after start, before the scheduler's roles got to run.
        entry_id = scheduler.register("@every 1s", Task("late"))

        async def listed() -> bool:
            return [e.id for e in await entries_of(redis, scheduler)] == [entry_id]

        # Not after one 30 s interval: a register triggers a heartbeat.
        await wait_until(listed)
        history = f"asynq:scheduler_history:{entry_id}"
        await wait_until(lambda: redis.exists(history))
        scheduler.unregister(entry_id)

        async def gone() -> bool:
            return await entries_of(redis, scheduler) == [] and not await redis.exists(history)

        await wait_until(gone)
        with pytest.raises(EntryNotFoundError, match=entry_id) as info:
            scheduler.unregister(entry_id)
        assert isinstance(info.value, KeyError)
        assert str(info.value) == f"no scheduler entry with id {entry_id!r}"
    finally:
        await scheduler.shutdown()


def test_register_rejects_bad_input(redis_url: str) -> None:
    scheduler = Scheduler(redis_url)
    with pytest.raises(ValueError, match=r"invalid cron spec '\* \* \*'"):
        scheduler.register("* * *", Task("t"))
    with pytest.raises(ValueError, match="queue name"):
        scheduler.register("@hourly", Task("t"), queue=" ")
    with pytest.raises(TypeError, match="qeueu"):
        scheduler.register("@hourly", Task("t"), qeueu="x")
    with pytest.raises(ValueError, match="timezone-aware"):
        scheduler.register("@hourly", Task("t"), deadline=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="Unique TTL"):
        scheduler.register("@hourly", Task("t"), unique=timedelta(milliseconds=10))
    with pytest.raises(TypeError, match="Task"):
        scheduler.register("@hourly", "t")  # type: ignore[arg-type]
    with pytest.raises(EntryNotFoundError):
        scheduler.unregister("nope")
    assert scheduler.entries == {}
    with pytest.raises(ValueError, match="heartbeat_interval"):
        Scheduler(redis_url, heartbeat_interval=timedelta(0))
    with pytest.raises(TypeError, match="location"):
        Scheduler(redis_url, location="UTC")  # type: ignore[arg-type]


async def test_lifecycle_errors(redis_url: str) -> None:
    dead = Scheduler(f"redis://127.0.0.1:{free_port()}/0")
    dead.register("@hourly", Task("t"))
    with pytest.raises(Exception, match=r"(?i)connect"):
        await dead.start()
    scheduler = Scheduler(redis_url)
    await scheduler.start()
    with pytest.raises(RuntimeError, match="running"):
        await scheduler.start()
    await scheduler.ping()
    await scheduler.shutdown()
    await scheduler.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        scheduler.register("@hourly", Task("t"))


def test_entry_identity_is_stable_and_covers_what_matters() -> None:
    base = entry_identity("*/5 * * * *", Task("t", b"p"), {"queue": "q"})
    # Every scheduler process must compute the same value, so it is pinned here:
    # changing it makes old and new schedulers enqueue the same ticks twice.
    assert base == "d97f1495493d82ff0950406df330d00a57ad03bfa8a2a2b60ce7db5ff92bae11"
    assert base == entry_identity("*/5  * * * * ", Task("t", b"p", queue="q"), {})
    assert base != entry_identity("*/5 * * * *", Task("t", b"p"), {"queue": "r"})
    assert base != entry_identity("*/5 * * * *", Task("t", b"q"), {"queue": "q"})
    assert base != entry_identity("*/5 * * * *", Task("u", b"p"), {"queue": "q"})
    assert base != entry_identity("*/6 * * * *", Task("t", b"p"), {"queue": "q"})
    assert base != entry_identity(
        "*/5 * * * *", Task("t", b"p", headers={"a": "b"}), {"queue": "q"}
    )
    # Option order does not matter.
    a = entry_identity("@hourly", Task("t"), {"queue": "q", "max_retry": 1})
    assert a == entry_identity("@hourly", Task("t"), {"max_retry": 1, "queue": "q"})
    assert tick_task_id(base, 60) == "ecd49d42-163b-55cd-b88a-31aefcb3a459"
    assert tick_task_id(base, 60) != tick_task_id(base, 61)
