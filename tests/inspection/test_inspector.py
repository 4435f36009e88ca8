"""Inspector on Redis states written the way Go asynq writes them (tests/support/gofixtures.py)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import ResponseError

from asyncq._inspection.inspector import Inspector
from asyncq.errors import (
    BrokerError,
    FailedPreconditionError,
    QueueNotEmptyError,
    QueueNotFoundError,
    TaskNotFoundError,
)
from asyncq.task import TaskState
from tests.support import gofixtures as go
from tests.support.gofixtures import GoTask, GoWorker
from tests.support.redis_server import RedisServer, free_port, server_binary

NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
async def insp(redis: Redis) -> AsyncIterator[Inspector]:
    inspector = Inspector(redis, clock=NOW.timestamp)
    async with inspector:
        yield inspector


async def ids_of(redis: Redis, key: str) -> list[str]:
    kind = (await redis.type(key)).decode()
    if kind == "list":
        return [m.decode() for m in await redis.lrange(key, 0, -1)]
    if kind == "zset":
        return [m.decode() for m in await redis.zrange(key, 0, -1)]
    return []


async def state_of(redis: Redis, t: GoTask) -> str | None:
    v = await redis.hget(t.key, "state")
    return None if v is None else v.decode()


# -- queues -----------------------------------------------------------------------------------


async def test_queues_sorted_and_queue_info(redis: Redis, insp: Inspector) -> None:
    p1 = GoTask("email", b'{"to":"a"}', queue="critical")
    p2 = GoTask("email", b"x", queue="critical")
    await go.enqueue(redis, p1, NOW - timedelta(seconds=10))
    await go.enqueue(redis, p2, NOW - timedelta(seconds=2))
    await go.seed_active(redis, GoTask("img", queue="critical"), NOW + timedelta(seconds=30))
    await go.schedule(redis, GoTask("later", queue="critical"), NOW + timedelta(hours=1))
    await go.seed_retry(
        redis,
        GoTask("r", queue="critical", retried=1, error_msg="boom"),
        NOW + timedelta(minutes=1),
    )
    await go.seed_archived(redis, GoTask("a", queue="critical"), NOW - timedelta(days=1))
    await go.seed_completed(
        redis,
        GoTask("c", queue="critical", completed_at=go.unix(NOW), retention=3600),
        result=b"ok",
    )
    for _ in range(3):
        await go.add_to_group(redis, GoTask("g", queue="critical", group_key="batch"), NOW)
    await go.add_to_group(redis, GoTask("g", queue="critical", group_key="other"), NOW)
    await go.seed_daily(redis, "critical", NOW, processed=7, failed=2)
    await go.seed_totals(redis, "critical", processed=100, failed=9)
    await go.seed_paused(redis, "critical", NOW)
    await go.register_queue(redis, "default")

    assert await insp.queues() == ["critical", "default"]
    info = await insp.queue_info("critical")
    assert (info.pending, info.active, info.scheduled, info.retry) == (2, 1, 1, 1)
    assert (info.archived, info.completed, info.aggregating, info.groups) == (1, 1, 4, 2)
    assert info.size == 11
    assert (info.processed, info.failed) == (7, 2)
    assert (info.processed_total, info.failed_total) == (100, 9)
    assert info.paused is True
    assert abs(info.latency - timedelta(seconds=10)) < timedelta(milliseconds=1)
    assert info.memory_usage > 0
    assert info.timestamp == NOW

    empty = await insp.queue_info("default")
    assert empty.size == 0 and empty.latency == timedelta(0) and not empty.paused
    assert empty.memory_usage == 0


async def test_queue_info_survives_ids_without_hashes(redis: Redis, insp: Inspector) -> None:
    # Released asynq's memory script fails here (spec 3.4); asyncq's has the nil guard.
    await go.enqueue(redis, GoTask("x"), NOW)
    await redis.lpush("asynq:{default}:pending", "ghost")
    await redis.zadd("asynq:{default}:archived", {"ghost2": 1})
    await redis.zadd("asynq:{default}:g:grp", {"ghost3": 1})
    await redis.sadd("asynq:{default}:groups", "grp")
    info = await insp.queue_info("default")
    assert info.pending == 2 and info.archived == 1 and info.aggregating == 1
    assert info.memory_usage > 0
    # Listing skips the ID whose hash is gone, as asynq does.
    assert len(await insp.list_pending("default")) == 1


async def test_undecodable_messages_are_shown_not_hidden(redis: Redis, insp: Inspector) -> None:
    await go.register_queue(redis, "default")
    await redis.hset("asynq:{default}:t:bad", mapping={"msg": b"\xff\xff\xff", "state": "archived"})
    await redis.zadd("asynq:{default}:archived", {"bad": go.unix(NOW)})
    (listed,) = await insp.list_archived("default")
    assert listed.id == "bad" and listed.payload == b"\xff\xff\xff"
    assert listed.last_error.startswith("undecodable task message")
    got = await insp.get_task("default", "bad")
    assert got.state is TaskState.ARCHIVED and got.payload == b"\xff\xff\xff"
    await insp.delete_task("default", "bad")
    assert not await redis.exists("asynq:{default}:t:bad")


async def test_undecodable_message_with_a_non_utf8_stored_reason(
    redis: Redis, insp: Inspector
) -> None:
    # Found by the stored-data fuzz test: the reason beside an undecodable message is
    # bytes from Redis like any other field, and was decoded strictly.
    await go.register_queue(redis, "default")
    await redis.hset(
        "asynq:{default}:t:bad",
        mapping={"msg": b"\xff\xff\xff", "state": "archived", "asyncq_error": b"bad \xff\xfe"},
    )
    await redis.zadd("asynq:{default}:archived", {"bad": go.unix(NOW)})
    got = await insp.get_task("default", "bad")
    assert got.state is TaskState.ARCHIVED and got.payload == b"\xff\xff\xff"
    assert got.last_error == "bad \ufffd\ufffd"


async def test_counters_near_int64_max_keep_precision(redis: Redis, insp: Inspector) -> None:
    await go.register_queue(redis, "default")
    await go.seed_totals(redis, "default", processed=2**63 - 1, failed=2**63 - 2)
    info = await insp.queue_info("default")
    assert info.processed_total == 2**63 - 1 and info.failed_total == 2**63 - 2


async def test_history_today_first(redis: Redis, insp: Inspector) -> None:
    await go.register_queue(redis, "default")
    await go.seed_daily(redis, "default", NOW, 5, 1)
    await go.seed_daily(redis, "default", NOW - timedelta(days=2), 9, 3)
    stats = await insp.history("default", 3)
    assert [(s.date, s.processed, s.failed) for s in stats] == [
        (NOW.date(), 5, 1),
        ((NOW - timedelta(days=1)).date(), 0, 0),
        ((NOW - timedelta(days=2)).date(), 9, 3),
    ]
    assert all(isinstance(s.date, date) and s.queue == "default" for s in stats)
    with pytest.raises(ValueError, match="days must be 1 or more"):
        await insp.history("default", 0)


async def test_groups(redis: Redis, insp: Inspector) -> None:
    for g in ("b", "a", "a"):
        await go.add_to_group(redis, GoTask("t", group_key=g), NOW)
    assert [(g.group, g.size) for g in await insp.groups("default")] == [("a", 2), ("b", 1)]


async def test_pause_resume(redis: Redis, insp: Inspector) -> None:
    await go.register_queue(redis, "default")
    await insp.pause("default")
    assert await redis.get("asynq:{default}:paused") == str(go.unix(NOW)).encode()
    with pytest.raises(FailedPreconditionError, match='queue "default" is already paused'):
        await insp.pause("default")
    await insp.resume("default")
    assert not await redis.exists("asynq:{default}:paused")
    with pytest.raises(FailedPreconditionError, match='queue "default" is not paused'):
        await insp.resume("default")


OPS: dict[str, Callable[[Inspector], Awaitable[Any]]] = {
    "queue_info": lambda i: i.queue_info("nope"),
    "history": lambda i: i.history("nope", 1),
    "groups": lambda i: i.groups("nope"),
    "pause": lambda i: i.pause("nope"),
    "resume": lambda i: i.resume("nope"),
    "delete_queue": lambda i: i.delete_queue("nope", force=True),
    "get_task": lambda i: i.get_task("nope", "x"),
    "list_pending": lambda i: i.list_pending("nope"),
    "list_aggregating": lambda i: i.list_aggregating("nope", "g"),
    "delete_task": lambda i: i.delete_task("nope", "x"),
    "run_task": lambda i: i.run_task("nope", "x"),
    "archive_task": lambda i: i.archive_task("nope", "x"),
    "delete_all": lambda i: i.delete_all("nope", "archived"),
    "run_all": lambda i: i.run_all("nope", "retry"),
    "archive_all": lambda i: i.archive_all("nope", "pending"),
    "update_task_payload": lambda i: i.update_task_payload("nope", "x", b""),
    "cluster_key_slot": lambda i: i.cluster_key_slot("nope"),
}


@pytest.mark.parametrize("op", sorted(OPS))
async def test_unknown_queue(redis: Redis, insp: Inspector, op: str) -> None:
    await go.register_queue(redis, "default")
    with pytest.raises(QueueNotFoundError, match="queue not found: 'nope'"):
        await OPS[op](insp)
    assert not await redis.exists("asynq:{nope}:paused")


async def test_bad_arguments(redis: Redis, insp: Inspector) -> None:
    await go.register_queue(redis, "default")
    with pytest.raises(ValueError, match="unknown task state 'done'"):
        await insp.list_tasks("default", "done")
    with pytest.raises(ValueError, match="page must be 1 or more"):
        await insp.list_pending("default", page=0)
    with pytest.raises(ValueError, match="page size must be 1 or more"):
        await insp.list_pending("default", size=0)
    with pytest.raises(ValueError, match="group is required"):
        await insp.list_tasks("default", "aggregating")
    with pytest.raises(ValueError, match="group applies to aggregating tasks only"):
        await insp.list_tasks("default", "pending", group="g")
    with pytest.raises(ValueError, match="cannot delete all active tasks"):
        await insp.delete_all("default", "active")
    with pytest.raises(ValueError, match="cannot run all pending tasks"):
        await insp.run_all("default", "pending")
    with pytest.raises(ValueError, match="cannot archive all archived tasks"):
        await insp.archive_all("default", "archived")
    with pytest.raises(ValueError, match="queue name must contain"):
        await insp.queue_info(" ")
    with pytest.raises(ValueError, match="task ID cannot be empty"):
        await insp.cancel("")


# -- listing ----------------------------------------------------------------------------------


async def test_list_pending_oldest_first_with_paging(redis: Redis, insp: Inspector) -> None:
    tasks = [GoTask("t", str(i).encode()) for i in range(5)]
    for i, t in enumerate(tasks):
        await go.enqueue(redis, t, NOW - timedelta(seconds=10 - i))
    page1 = await insp.list_pending("default", size=2)
    page2 = await insp.list_pending("default", page=2, size=2)
    page3 = await insp.list_pending("default", page=3, size=2)
    page4 = await insp.list_pending("default", page=4, size=2)
    assert [t.id for t in page1 + page2 + page3] == [t.id for t in tasks]
    assert page4 == []
    assert all(t.state is TaskState.PENDING and t.next_process_at == NOW for t in page1)
    assert page1[0].payload == b"0" and page1[0].max_retry == 25


async def test_list_active_marks_orphans(redis: Redis, insp: Inspector) -> None:
    live = GoTask("live")
    dead = GoTask("dead")
    await go.seed_active(redis, dead, NOW - timedelta(seconds=5))
    await go.seed_active(redis, live, NOW + timedelta(seconds=25))
    active = await insp.list_active("default")
    assert [(t.id, t.is_orphaned) for t in active] == [(dead.id, True), (live.id, False)]
    assert all(t.next_process_at is None for t in active)


async def test_list_zsets_ascending(redis: Redis, insp: Inspector) -> None:
    s = [GoTask("s", b"%d" % i) for i in range(3)]
    for i, t in enumerate(reversed(s)):
        await go.schedule(redis, t, NOW + timedelta(minutes=30 - 10 * i))
    listed = await insp.list_scheduled("default")
    assert [t.id for t in listed] == [t.id for t in s]
    assert listed[0].next_process_at == NOW + timedelta(minutes=10)

    r = GoTask("r", retried=3, error_msg="db down", last_failed_at=go.unix(NOW))
    await go.seed_retry(redis, r, NOW + timedelta(seconds=99))
    (retry,) = await insp.list_retry("default")
    assert (retry.retried, retry.last_error) == (3, "db down")
    assert retry.last_failed_at == NOW and retry.next_process_at == NOW + timedelta(seconds=99)

    a_old, a_new = GoTask("a"), GoTask("a")
    await go.seed_archived(redis, a_new, NOW)
    await go.seed_archived(redis, a_old, NOW - timedelta(hours=1))
    archived = await insp.list_archived("default")
    assert [t.id for t in archived] == [a_old.id, a_new.id]
    assert archived[0].next_process_at is None

    c = GoTask("c", completed_at=go.unix(NOW), retention=60)
    await go.seed_completed(redis, c, result=b"\x00\x01")
    (done,) = await insp.list_completed("default")
    assert done.result == b"\x00\x01" and done.completed_at == NOW
    assert done.retention == timedelta(seconds=60)

    g = [GoTask("g", group_key="grp") for _ in range(3)]
    for i, t in enumerate(g):
        await go.add_to_group(redis, t, NOW + timedelta(seconds=i))
    agg = await insp.list_aggregating("default", "grp", size=2)
    assert [t.id for t in agg] == [g[0].id, g[1].id]
    assert agg[0].group == "grp" and agg[0].state is TaskState.AGGREGATING


async def test_get_task_decodes_every_go_field(redis: Redis, insp: Inspector) -> None:
    t = GoTask(
        "report:build",
        b'{"id":7}',
        queue="low",
        retry=3,
        retried=2,
        error_msg="timeout",
        timeout=0,
        deadline=go.unix(NOW + timedelta(hours=2)),
        last_failed_at=go.unix(NOW - timedelta(minutes=1)),
        headers={"trace": "abc", "empty": ""},
    )
    await go.seed_retry(redis, t, NOW + timedelta(minutes=5))
    info = await insp.get_task("low", t.id)
    assert (info.id, info.queue, info.type, info.payload) == (t.id, "low", t.type, t.payload)
    assert (info.state, info.max_retry, info.retried, info.last_error) == (
        TaskState.RETRY,
        3,
        2,
        "timeout",
    )
    assert info.timeout is None and info.deadline == NOW + timedelta(hours=2)
    assert info.last_failed_at == NOW - timedelta(minutes=1)
    assert info.next_process_at == NOW + timedelta(minutes=5)
    assert info.headers == {"trace": "abc", "empty": ""}
    assert info.result is None and info.group == ""

    p = GoTask("p")
    await go.enqueue(redis, p, NOW)
    assert (await insp.get_task("default", p.id)).next_process_at == NOW
    with pytest.raises(TaskNotFoundError, match="task not found: id='missing'"):
        await insp.get_task("default", "missing")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    type_=st.text(min_size=1, max_size=20).filter(str.strip),
    payload=st.binary(max_size=64),
    retry=st.integers(0, 2**31 - 1),
    retried=st.integers(-(2**31), 2**31 - 1),
    error=st.text(max_size=30),
    timeout=st.integers(0, 2**40),
    headers=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)
async def test_get_task_roundtrips_go_bytes(
    redis: Redis,
    insp: Inspector,
    type_: str,
    payload: bytes,
    retry: int,
    retried: int,
    error: str,
    timeout: int,  # noqa: ASYNC109 - the task's timeout field, not an await timeout
    headers: dict[str, str],
) -> None:
    t = GoTask(
        type_, payload, retry=retry, retried=retried, error_msg=error, timeout=timeout,
        headers=headers,
    )  # fmt: skip
    await go.schedule(redis, t, NOW + timedelta(seconds=5))
    info = await insp.get_task("default", t.id)
    assert (info.type, info.payload, info.max_retry, info.retried) == (
        type_,
        payload,
        retry,
        retried,
    )
    assert info.last_error == error and info.headers == headers
    assert info.timeout == (timedelta(seconds=timeout) if timeout else None)


# -- single-task operations -------------------------------------------------------------------


async def test_run_task_moves_to_pending_and_wakes_workers(redis: Redis, insp: Inspector) -> None:
    a = GoTask("a")
    await go.seed_archived(redis, a, NOW)
    pubsub = redis.pubsub()
    await pubsub.subscribe("asyncq:wakeup:{default}")
    await pubsub.get_message(timeout=1)  # subscribe confirmation
    await insp.run_task("default", a.id)
    assert await ids_of(redis, "asynq:{default}:pending") == [a.id]
    assert await ids_of(redis, "asynq:{default}:archived") == []
    assert await state_of(redis, a) == "pending"
    assert int(await redis.hget(a.key, "pending_since")) == go.unix_ns(NOW)
    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2)
    assert msg is not None and msg["data"] == b"default"
    await pubsub.aclose()
    with pytest.raises(FailedPreconditionError, match="task is already in pending state"):
        await insp.run_task("default", a.id)

    act = GoTask("act")
    await go.seed_active(redis, act, NOW)
    with pytest.raises(FailedPreconditionError, match="task is already running"):
        await insp.run_task("default", act.id)
    with pytest.raises(TaskNotFoundError):
        await insp.run_task("default", "nope")

    g = GoTask("g", group_key="grp")
    await go.add_to_group(redis, g, NOW)
    await insp.run_task("default", g.id)
    assert not await redis.exists("asynq:{default}:g:grp")
    assert await redis.smembers("asynq:{default}:groups") == set()
    assert (await insp.get_task("default", g.id)).state is TaskState.PENDING

    c = GoTask("c", completed_at=go.unix(NOW), retention=10)
    await go.seed_completed(redis, c)
    await insp.run_task("default", c.id)
    assert await state_of(redis, c) == "pending"


async def test_archive_task(redis: Redis, insp: Inspector) -> None:
    p1, p2 = GoTask("p1"), GoTask("p2")
    await go.enqueue(redis, p1, NOW)
    await go.enqueue(redis, p2, NOW)
    await insp.archive_task("default", p1.id)
    assert await ids_of(redis, "asynq:{default}:pending") == [p2.id]
    assert await redis.zscore("asynq:{default}:archived", p1.id) == go.unix(NOW)
    assert await state_of(redis, p1) == "archived"
    with pytest.raises(FailedPreconditionError, match=r"^task is already archived$"):
        await insp.archive_task("default", p1.id)
    act = GoTask("act")
    await go.seed_active(redis, act, NOW)
    with pytest.raises(
        FailedPreconditionError,
        match=r"^cannot archive task in active state\. use CancelProcessing instead\.$",
    ):
        await insp.archive_task("default", act.id)
    g1, g2 = GoTask("g", group_key="grp"), GoTask("g", group_key="grp")
    await go.add_to_group(redis, g1, NOW)
    await go.add_to_group(redis, g2, NOW)
    await insp.archive_task("default", g1.id)
    assert await redis.smembers("asynq:{default}:groups") == {b"grp"}
    await insp.archive_task("default", g2.id)
    assert await redis.smembers("asynq:{default}:groups") == set()


async def test_archive_task_trims_by_age_alone(redis: Redis, insp: Inspector) -> None:
    old, recent = GoTask("old"), GoTask("recent")
    await go.seed_archived(redis, old, NOW - timedelta(days=91))
    await go.seed_archived(redis, recent, NOW - timedelta(days=89))
    p = GoTask("p")
    await go.schedule(redis, p, NOW + timedelta(hours=1))
    await insp.archive_task("default", p.id)
    assert await ids_of(redis, "asynq:{default}:archived") == [recent.id, p.id]
    assert not await redis.exists(old.key)
    assert await state_of(redis, recent) == "archived"


async def test_archive_trim_deletes_trimmed_hashes(redis: Redis, insp: Inspector) -> None:
    old = GoTask("old")
    await go.seed_archived(redis, old, NOW - timedelta(days=91))
    # Fill the archive to the cap: the trim keeps the newest 9,999 (asynq's arithmetic).
    pipe = redis.pipeline(transaction=False)
    filler = [GoTask("f") for _ in range(10_000)]
    for i, t in enumerate(filler):
        pipe.hset(t.key, mapping={"msg": t.encode(), "state": "archived"})
        pipe.zadd("asynq:{default}:archived", {t.id: go.unix(NOW) - 10_000 + i})
    await pipe.execute()
    p = GoTask("p")
    await go.enqueue(redis, p, NOW)
    await insp.archive_task("default", p.id)
    members = set(await ids_of(redis, "asynq:{default}:archived"))
    assert len(members) == 9_999 and p.id in members and old.id not in members
    # Every trimmed ID lost its hash and every kept ID still has one.
    task_keys = {k.decode() async for k in redis.scan_iter(match="asynq:{default}:t:*", count=5000)}
    assert task_keys == {f"asynq:{{default}}:t:{i}" for i in members}


async def test_delete_task_releases_unique_lock(redis: Redis, insp: Inspector) -> None:
    u = GoTask("u", unique_key="asynq:{default}:unique:u:")
    await go.enqueue(redis, u, NOW)
    assert await redis.get(u.unique_key) == u.id.encode()
    await insp.delete_task("default", u.id)
    assert not await redis.exists(u.key) and not await redis.exists(u.unique_key)
    assert await ids_of(redis, "asynq:{default}:pending") == []
    act = GoTask("act")
    await go.seed_active(redis, act, NOW)
    with pytest.raises(
        FailedPreconditionError,
        match=r"^cannot delete task in active state\. use CancelProcessing instead\.$",
    ):
        await insp.delete_task("default", act.id)
    with pytest.raises(TaskNotFoundError):
        await insp.delete_task("default", "nope")
    for seed in (
        lambda t: go.schedule(redis, t, NOW),
        lambda t: go.seed_retry(redis, t, NOW),
        lambda t: go.seed_archived(redis, t, NOW),
    ):
        t = GoTask("z")
        await seed(t)
        await insp.delete_task("default", t.id)
        assert not await redis.exists(t.key)
    g = GoTask("g", group_key="grp")
    await go.add_to_group(redis, g, NOW)
    await insp.delete_task("default", g.id)
    assert await redis.smembers("asynq:{default}:groups") == set()


async def snapshot(redis: Redis) -> dict[bytes, tuple[bytes, bytes | None]]:
    """Every key with its type and DUMP bytes: equal snapshots mean nothing was written."""
    return {k: (await redis.type(k), await redis.dump(k)) for k in sorted(await redis.keys("*"))}


SINGLE_TASK_OPS = ["run_task", "archive_task", "delete_task"]


@pytest.mark.parametrize("op", SINGLE_TASK_OPS)
async def test_single_task_op_refuses_a_hash_without_state(
    redis: Redis, insp: Inspector, op: str
) -> None:
    p = GoTask("p")
    await go.enqueue(redis, p, NOW)
    broken = GoTask("broken")
    await redis.hset(broken.key, "msg", broken.encode())
    await redis.zadd("asynq:{default}:scheduled", {broken.id: go.unix(NOW)})
    before = await snapshot(redis)
    with pytest.raises(BrokerError, match=r"internal error: task hash has no state field") as err:
        await getattr(insp, op)("default", broken.id)
    assert str(err.value).endswith(f"no state field: {broken.key}")
    assert await snapshot(redis) == before


@pytest.mark.parametrize("op", SINGLE_TASK_OPS)
async def test_single_task_op_on_a_grouped_task_checks_the_groups_set_first(
    redis: Redis, insp: Inspector, op: str
) -> None:
    # The task is its group's last: the op would empty the group and then SREM the
    # groups key, which is not a set. The check must refuse before the first write.
    g = GoTask("g", group_key="grp")
    await go.add_to_group(redis, g, NOW)
    await redis.delete("asynq:{default}:groups")
    await redis.rpush("asynq:{default}:groups", "grp")
    before = await snapshot(redis)
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await getattr(insp, op)("default", g.id)
    assert await snapshot(redis) == before
    # A scheduled task that carries a group name never touches the groups key.
    s = GoTask("s", group_key="grp")
    await go.schedule(redis, s, NOW + timedelta(hours=1))
    await getattr(insp, op)("default", s.id)
    assert await redis.lrange("asynq:{default}:groups", 0, -1) == [b"grp"]
    assert await redis.zscore("asynq:{default}:scheduled", s.id) is None


async def test_delete_task_removes_every_copy_from_pending(redis: Redis, insp: Inspector) -> None:
    # A pending list holding an id twice (an old double push) must not keep a copy
    # that points at the deleted hash.
    p, d = GoTask("p"), GoTask("d")
    await go.enqueue(redis, p, NOW)
    await go.enqueue(redis, d, NOW)
    await redis.rpush("asynq:{default}:pending", d.id)
    await insp.delete_task("default", d.id)
    assert await ids_of(redis, "asynq:{default}:pending") == [p.id]
    assert not await redis.exists(d.key)


async def test_archive_task_removes_every_copy_from_pending(redis: Redis, insp: Inspector) -> None:
    # A copy left in pending would be taken by a worker: an archived task would run.
    p, a = GoTask("p"), GoTask("a")
    await go.enqueue(redis, p, NOW)
    await go.enqueue(redis, a, NOW)
    await redis.rpush("asynq:{default}:pending", a.id)
    await insp.archive_task("default", a.id)
    assert await ids_of(redis, "asynq:{default}:pending") == [p.id]
    assert await ids_of(redis, "asynq:{default}:archived") == [a.id]


async def test_run_task_queues_behind_the_pending_tasks(redis: Redis, insp: Inspector) -> None:
    # Workers take from the tail of the pending list, so a task run from the Inspector
    # goes to the head: behind the tasks already waiting, as in asynq.
    p = GoTask("p")
    await go.enqueue(redis, p, NOW)
    a = GoTask("a")
    await go.seed_archived(redis, a, NOW)
    await insp.run_task("default", a.id)
    assert await ids_of(redis, "asynq:{default}:pending") == [a.id, p.id]


async def test_update_task_payload(redis: Redis, insp: Inspector) -> None:
    s = GoTask("s", b"old", headers={"h": "1"})
    await go.schedule(redis, s, NOW + timedelta(hours=1))
    info = await insp.update_task_payload("default", s.id, b"new")
    assert info.payload == b"new" and info.headers == {"h": "1"}
    assert info.next_process_at == NOW + timedelta(hours=1)
    assert (await insp.get_task("default", s.id)).payload == b"new"
    assert await state_of(redis, s) == "scheduled"
    p = GoTask("p")
    await go.enqueue(redis, p, NOW)
    with pytest.raises(FailedPreconditionError, match="only scheduled tasks"):
        await insp.update_task_payload("default", p.id, b"x")
    with pytest.raises(TaskNotFoundError):
        await insp.update_task_payload("default", "nope", b"x")


async def test_cancel_publishes(redis: Redis, insp: Inspector) -> None:
    pubsub = redis.pubsub()
    await pubsub.subscribe("asynq:cancel")
    await pubsub.get_message(timeout=1)
    await insp.cancel("task-1")
    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2)
    assert msg is not None and msg["data"] == b"task-1"
    await pubsub.aclose()


# -- bulk operations --------------------------------------------------------------------------


async def seed_every_state(redis: Redis) -> dict[str, list[GoTask]]:
    out: dict[str, list[GoTask]] = {}
    out["pending"] = [GoTask("p", unique_key=f"asynq:{{default}}:unique:p:{i}") for i in range(2)]
    for t in out["pending"]:
        await go.enqueue(redis, t, NOW)
    out["scheduled"] = [GoTask("s") for _ in range(3)]
    for t in out["scheduled"]:
        await go.schedule(redis, t, NOW + timedelta(hours=1))
    out["retry"] = [GoTask("r") for _ in range(2)]
    for t in out["retry"]:
        await go.seed_retry(redis, t, NOW)
    out["archived"] = [GoTask("a") for _ in range(2)]
    for t in out["archived"]:
        await go.seed_archived(redis, t, NOW)
    out["completed"] = [GoTask("c", completed_at=go.unix(NOW), retention=60)]
    for t in out["completed"]:
        await go.seed_completed(redis, t)
    out["aggregating"] = [GoTask("g", group_key="grp") for _ in range(2)]
    for t in out["aggregating"]:
        await go.add_to_group(redis, t, NOW)
    await go.add_to_group(redis, GoTask("g", group_key="other"), NOW)
    out["active"] = [GoTask("act")]
    await go.seed_active(redis, out["active"][0], NOW + timedelta(seconds=30))
    return out


@pytest.mark.parametrize(
    "state", ["pending", "scheduled", "retry", "archived", "completed", "aggregating"]
)
async def test_delete_all(redis: Redis, insp: Inspector, state: str) -> None:
    seeded = await seed_every_state(redis)
    group = "grp" if state == "aggregating" else None
    n = await insp.delete_all("default", state, group=group)
    assert n == len(seeded[state])
    for t in seeded[state]:
        assert not await redis.exists(t.key)
        if t.unique_key:
            assert not await redis.exists(t.unique_key)
    info = await insp.queue_info("default")
    assert getattr(info, state) == (1 if state == "aggregating" else 0)
    if state == "aggregating":
        assert await redis.smembers("asynq:{default}:groups") == {b"other"}
        assert not await redis.exists("asynq:{default}:g:grp")
        assert await redis.zcard("asynq:{default}:g:other") == 1
    assert info.active == 1


@pytest.mark.parametrize("state", ["scheduled", "retry", "archived", "aggregating"])
async def test_run_all(redis: Redis, insp: Inspector, state: str) -> None:
    seeded = await seed_every_state(redis)
    group = "grp" if state == "aggregating" else None
    n = await insp.run_all("default", state, group=group)
    assert n == len(seeded[state])
    pending = await ids_of(redis, "asynq:{default}:pending")
    assert len(pending) == 2 + n
    for t in seeded[state]:
        assert t.id in pending and await state_of(redis, t) == "pending"
        assert int(await redis.hget(t.key, "pending_since")) == go.unix_ns(NOW)
    assert await insp.run_all("default", state, group=group) == 0


@pytest.mark.parametrize("state", ["pending", "scheduled", "retry", "aggregating"])
async def test_archive_all(redis: Redis, insp: Inspector, state: str) -> None:
    seeded = await seed_every_state(redis)
    group = "grp" if state == "aggregating" else None
    n = await insp.archive_all("default", state, group=group)
    assert n == len(seeded[state])
    archived = await ids_of(redis, "asynq:{default}:archived")
    assert len(archived) == 2 + n
    for t in seeded[state]:
        assert t.id in archived and await state_of(redis, t) == "archived"
    info = await insp.queue_info("default")
    assert getattr(info, state) == (1 if state == "aggregating" else 0)
    if state == "aggregating":
        assert await redis.smembers("asynq:{default}:groups") == {b"other"}
        assert not await redis.exists("asynq:{default}:g:grp")
        assert await redis.zcard("asynq:{default}:g:other") == 1


SEEDERS: dict[str, Callable[[Redis, GoTask], Awaitable[None]]] = {
    "pending": lambda r, t: go.enqueue(r, t, NOW),
    "scheduled": lambda r, t: go.schedule(r, t, NOW + timedelta(hours=1)),
    "retry": lambda r, t: go.seed_retry(r, t, NOW),
    "archived": lambda r, t: go.seed_archived(r, t, NOW),
}


@pytest.mark.parametrize(
    "state", ["pending", "scheduled", "retry", "archived", "completed", "aggregating"]
)
async def test_delete_all_releases_only_the_locks_its_tasks_own(
    redis: Redis, insp: Inspector, state: str
) -> None:
    lock = "asynq:{default}:unique:"
    own, stale = (
        GoTask(
            name,
            unique_key=lock + name,
            completed_at=go.unix(NOW),
            retention=60,
            group_key="grp",
        )
        for name in ("own", "stale")
    )
    for t in (own, stale):
        if state in ("completed", "aggregating"):
            # A unique task that reached its group from the scheduled set keeps the
            # unique_key field the scheduling wrote.
            if state == "completed":
                await go.seed_completed(redis, t)
            else:
                await go.add_to_group(redis, t, NOW)
            await redis.hset(t.key, "unique_key", t.unique_key)
            await redis.set(t.unique_key, t.id)
        else:
            await SEEDERS[state](redis, t)
    # The stale task's lock was taken over by a newer task with the same key.
    await redis.set(stale.unique_key, "newer")
    group = "grp" if state == "aggregating" else None
    assert await insp.delete_all("default", state, group=group) == 2
    assert not await redis.exists(own.unique_key, own.key, stale.key)
    assert await redis.get(stale.unique_key) == b"newer"


async def test_delete_task_keeps_a_lock_another_task_holds(redis: Redis, insp: Inspector) -> None:
    t = GoTask("t", unique_key="asynq:{default}:unique:t:")
    await go.schedule(redis, t, NOW + timedelta(hours=1))
    await redis.set(t.unique_key, "newer")
    await insp.delete_task("default", t.id)
    assert not await redis.exists(t.key)
    assert await redis.get(t.unique_key) == b"newer"


@pytest.mark.parametrize("state", ["scheduled", "aggregating"])
async def test_run_all_queues_behind_the_pending_tasks(
    redis: Redis, insp: Inspector, state: str
) -> None:
    seeded = await seed_every_state(redis)
    group = "grp" if state == "aggregating" else None
    await insp.run_all("default", state, group=group)
    # Pushed at the head in score order: the earliest to run is nearest the tail, and
    # every task already pending still runs before them.
    by_score = [m.decode() for m in await redis.zrange(f"asynq:{{default}}:{state}", 0, -1)]
    assert by_score == []
    moved = await ids_of(redis, "asynq:{default}:pending")
    assert moved[-2:] == [t.id for t in reversed(seeded["pending"])]
    assert set(moved[:-2]) == {t.id for t in seeded[state]}
    if state == "aggregating":
        assert await redis.smembers("asynq:{default}:groups") == {b"other"}
        assert await redis.zcard("asynq:{default}:g:other") == 1


async def test_run_all_keeps_the_score_order(redis: Redis, insp: Inspector) -> None:
    s1, s2, s3 = GoTask("s1"), GoTask("s2"), GoTask("s3")
    await go.schedule(redis, s2, NOW + timedelta(hours=2))
    await go.schedule(redis, s1, NOW + timedelta(hours=1))
    await go.schedule(redis, s3, NOW + timedelta(hours=3))
    assert await insp.run_all("default", "scheduled") == 3
    assert await ids_of(redis, "asynq:{default}:pending") == [s3.id, s2.id, s1.id]


@pytest.mark.parametrize("state", ["pending", "scheduled", "retry", "aggregating"])
async def test_archive_all_trims_by_age_alone(redis: Redis, insp: Inspector, state: str) -> None:
    seeded = await seed_every_state(redis)
    old, recent = GoTask("old"), GoTask("recent")
    await go.seed_archived(redis, old, NOW - timedelta(days=91))
    await go.seed_archived(redis, recent, NOW - timedelta(days=89))
    group = "grp" if state == "aggregating" else None
    report = await insp.archive_all_report("default", state, group=group)
    assert (report.moved, report.deleted) == (len(seeded[state]), 1)
    kept = set(await ids_of(redis, "asynq:{default}:archived"))
    assert kept == {t.id for t in seeded["archived"] + seeded[state] + [recent]}
    assert not await redis.exists(old.key)


@pytest.mark.parametrize("state", ["pending", "scheduled", "retry", "aggregating"])
async def test_archive_all_trims_by_age_and_cap_with_the_hashes(
    redis: Redis, insp: Inspector, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded = await seed_every_state(redis)  # two archived now, two or three of each state
    # A cap keeps one task fewer (asynq's ZRANGE 0 -cap arithmetic): here the two
    # archived now and those this call archives.
    monkeypatch.setattr("asyncq._broker.inspect.ARCHIVE_MAX_SIZE", len(seeded[state]) + 3)
    too_old = GoTask("old")
    await go.seed_archived(redis, too_old, NOW - timedelta(days=91))
    older = [GoTask("o") for _ in range(2)]
    for i, t in enumerate(older):
        await go.seed_archived(redis, t, NOW - timedelta(days=1, seconds=-i))
    group = "grp" if state == "aggregating" else None
    report = await insp.archive_all_report("default", state, group=group)
    # The one archived 91 days ago goes by age, the two a day old over the cap.
    assert (report.moved, report.deleted) == (len(seeded[state]), 3)
    kept = await ids_of(redis, "asynq:{default}:archived")
    assert set(kept) == {t.id for t in seeded["archived"] + seeded[state]}
    for t in [too_old, *older]:
        assert not await redis.exists(t.key)
    for t in seeded["archived"] + seeded[state]:
        assert await state_of(redis, t) == "archived"
    # Another queue's archive is never trimmed, and no other task hash is touched.
    other = GoTask("x", queue="other")
    await go.seed_archived(redis, other, NOW - timedelta(days=91))
    assert await insp.archive_all("default", state, group=group) == 0
    assert await redis.exists(other.key)
    assert await ids_of(redis, "asynq:{other}:archived") == [other.id]


async def test_bulk_ops_drop_ids_without_hashes(redis: Redis, insp: Inspector) -> None:
    await go.register_queue(redis, "default")
    await redis.zadd("asynq:{default}:retry", {"ghost": 1})
    assert await insp.run_all("default", "retry") == 0
    assert await ids_of(redis, "asynq:{default}:pending") == []
    assert not await redis.exists("asynq:{default}:t:ghost")
    await redis.lpush("asynq:{default}:pending", "ghost")
    assert await insp.archive_all("default", "pending") == 0
    assert not await redis.exists("asynq:{default}:t:ghost")
    assert await ids_of(redis, "asynq:{default}:archived") == []


@pytest.mark.parametrize(
    ("op", "state"),
    [
        ("run_all", "scheduled"),
        ("run_all", "aggregating"),
        ("archive_all", "pending"),
        ("archive_all", "retry"),
        ("archive_all", "aggregating"),
        ("delete_all", "pending"),
        ("delete_all", "archived"),
        ("delete_all", "aggregating"),
    ],
)
async def test_bulk_op_drops_an_id_without_hash(
    redis: Redis, insp: Inspector, op: str, state: str
) -> None:
    await go.register_queue(redis, "default")
    source = "asynq:{default}:g:grp" if state == "aggregating" else f"asynq:{{default}}:{state}"
    if state == "pending":
        await redis.lpush(source, "ghost")
    else:
        await redis.zadd(source, {"ghost": 1})
    if state == "aggregating":
        await redis.sadd("asynq:{default}:groups", "grp")
    group = "grp" if state == "aggregating" else None
    assert await getattr(insp, op)("default", state, group=group) == 0
    assert await redis.keys("asynq:{default}:*") == []


# -- delete queue -----------------------------------------------------------------------------


async def test_delete_queue(redis: Redis, insp: Inspector) -> None:
    await go.register_queue(redis, "empty")
    await go.seed_paused(redis, "empty", NOW)
    await insp.delete_queue("empty")
    assert await insp.queues() == []
    assert not await redis.exists("asynq:{empty}:paused")

    seeded = await seed_every_state(redis)
    await go.seed_totals(redis, "default", 5, 1)
    with pytest.raises(QueueNotEmptyError, match="queue is not empty: 'default'"):
        await insp.delete_queue("default")
    with pytest.raises(FailedPreconditionError, match="cannot remove queue with active tasks"):
        await insp.delete_queue("default", force=True)
    await redis.delete("asynq:{default}:active", "asynq:{default}:lease", seeded["active"][0].key)
    await insp.delete_queue("default", force=True)
    assert await insp.queues() == []
    remaining = sorted([k.decode() async for k in redis.scan_iter(match="asynq:{default}:*")])
    # Only the counters stay (as in asynq); every task hash and lock is gone.
    assert remaining == ["asynq:{default}:failed", "asynq:{default}:processed"]


async def test_force_delete_queue_removes_staged_aggregation_sets(
    redis: Redis, insp: Inspector
) -> None:
    staged = [GoTask("g", group_key="grp") for _ in range(2)]
    set_key = await go.seed_aggregation_set(
        redis, "default", "grp", staged, NOW, NOW + timedelta(minutes=2)
    )
    staged_later = [GoTask("g", group_key="grp") for _ in range(2)]
    later_key = await go.seed_aggregation_set(
        redis, "default", "grp", staged_later, NOW, NOW + timedelta(minutes=3)
    )
    with pytest.raises(QueueNotEmptyError):
        await insp.delete_queue("default")
    await insp.delete_queue("default", force=True)
    assert not await redis.exists(set_key, later_key, "asynq:{default}:aggregation_sets")
    assert not await redis.exists(*(t.key for t in staged + staged_later))


async def test_force_delete_queue_never_follows_a_set_of_another_queue(
    redis: Redis, insp: Inspector
) -> None:
    # A damaged aggregation_sets index naming another queue's staged set: removing
    # this queue drops the entry but leaves that set and its tasks to their queue.
    theirs = [GoTask("g", group_key="grp", queue="other") for _ in range(2)]
    their_set = await go.seed_aggregation_set(
        redis, "other", "grp", theirs, NOW, NOW + timedelta(minutes=2)
    )
    await go.register_queue(redis, "default")
    await redis.zadd("asynq:{default}:aggregation_sets", {their_set: go.unix(NOW)})
    await insp.delete_queue("default", force=True)
    assert not await redis.exists("asynq:{default}:aggregation_sets")
    assert await redis.zcard(their_set) == 2
    assert await redis.exists(*(t.key for t in theirs)) == 2
    assert await insp.queues() == ["other"]


@pytest.mark.parametrize(
    "state", ["pending", "scheduled", "retry", "archived", "completed", "aggregating", "staged"]
)
async def test_delete_queue_refuses_one_task_in_any_state(
    redis: Redis, insp: Inspector, state: str
) -> None:
    t = GoTask("t", group_key="grp", completed_at=go.unix(NOW), retention=60)
    if state == "completed":
        await go.seed_completed(redis, t)
    elif state == "aggregating":
        await go.add_to_group(redis, t, NOW)
    elif state == "staged":
        await go.seed_aggregation_set(redis, "default", "grp", [t], NOW, NOW)
    else:
        await SEEDERS[state](redis, t)
    before = await snapshot(redis)
    with pytest.raises(QueueNotEmptyError):
        await insp.delete_queue("default")
    assert await snapshot(redis) == before


async def test_delete_queue_of_empty_groups_and_kept_locks(redis: Redis, insp: Inspector) -> None:
    # A group still named in the groups set but with no task left does not make the
    # queue non-empty; the set goes with the queue.
    await go.register_queue(redis, "default")
    await redis.sadd("asynq:{default}:groups", "gone")
    # An idle worker's direct-delivery registration goes with the queue too.
    await redis.rpush("asynq:{default}:asyncq:waiters", "30:asyncq:delivery:gone-server")
    await insp.delete_queue("default")
    assert await redis.keys("*") == []
    # A forced removal deletes the locks its tasks own, never one a newer task took over.
    own = GoTask("own", unique_key="asynq:{default}:unique:own")
    stale = GoTask("stale", unique_key="asynq:{default}:unique:stale")
    await go.schedule(redis, own, NOW + timedelta(hours=1))
    await go.enqueue(redis, stale, NOW)
    await redis.set(stale.unique_key, "newer")
    await insp.delete_queue("default", force=True)
    assert sorted(await redis.keys("*")) == [stale.unique_key.encode()]


async def test_delete_queue_refuses_completed_or_aggregating(redis: Redis, insp: Inspector) -> None:
    await go.seed_completed(redis, GoTask("c", completed_at=go.unix(NOW), retention=60))
    with pytest.raises(QueueNotEmptyError):
        await insp.delete_queue("default")
    await insp.delete_all("default", "completed")
    await go.add_to_group(redis, GoTask("g", group_key="grp"), NOW)
    with pytest.raises(QueueNotEmptyError):
        await insp.delete_queue("default")


# -- servers and schedulers -------------------------------------------------------------------


async def test_servers_with_workers_and_stale_pruning(redis: Redis, insp: Inspector) -> None:
    t1 = GoTask("img:resize", b"\x89PNG", queue="low")
    t2 = GoTask("email", b"{}")
    workers = [
        GoWorker(t1, NOW - timedelta(seconds=3), NOW + timedelta(minutes=30)),
        GoWorker(t2, NOW - timedelta(seconds=9), NOW + timedelta(minutes=29)),
    ]
    sid = await go.seed_server(
        redis,
        now=NOW,
        host="web-1",
        pid=77,
        concurrency=8,
        queues={"default": 3, "low": 1},
        strict_priority=True,
        workers=workers,
        started=NOW - timedelta(hours=1),
    )
    await go.seed_server(redis, now=NOW - timedelta(seconds=60), host="dead", pid=1)
    (server,) = await insp.servers()
    assert (server.id, server.host, server.pid, server.concurrency) == (sid, "web-1", 77, 8)
    assert server.queues == {"default": 3, "low": 1} and server.strict_priority
    assert server.status == "active" and server.started == NOW - timedelta(hours=1)
    assert [w.task_id for w in server.active_workers] == [t2.id, t1.id]
    w = server.active_workers[1]
    assert (w.task_type, w.task_payload, w.queue) == ("img:resize", b"\x89PNG", "low")
    assert w.started == NOW - timedelta(seconds=3) and w.deadline == NOW + timedelta(minutes=30)
    # The stale server was pruned from both index sets, as asynq's ListServers does.
    assert await redis.zcard("asynq:servers") == 1
    assert await redis.zcard("asynq:workers") == 1


async def test_scheduler_entries_and_events(redis: Redis, insp: Inspector) -> None:
    e1 = go.encode_scheduler_entry(
        entry_id="e1",
        spec="@every 30s",
        task_type="ping",
        payload=b"",
        options=['Queue("critical")', "MaxRetry(3)", "Timeout(1m30s)", 'TaskID("x")'],
        next_at=NOW + timedelta(seconds=30),
        prev_at=None,
    )
    e2 = go.encode_scheduler_entry(
        entry_id="e2",
        spec="0 * * * *",
        task_type="report",
        payload=b'{"a":1}',
        options=[],
        next_at=NOW + timedelta(minutes=20),
        prev_at=NOW - timedelta(minutes=40),
    )
    await go.seed_scheduler(redis, "host:1:abc", [e1, e2], NOW)
    entries = await insp.scheduler_entries()
    assert [e.id for e in entries] == ["e1", "e2"]
    assert entries[0].options == [
        'Queue("critical")',
        "MaxRetry(3)",
        "Timeout(1m30s)",
        'TaskID("x")',
    ]
    assert entries[0].prev is None and entries[0].next == NOW + timedelta(seconds=30)
    assert entries[1].prev == NOW - timedelta(minutes=40) and entries[1].task_payload == b'{"a":1}'

    for i in range(5):
        await go.seed_enqueue_event(redis, "e1", f"task-{i}", NOW - timedelta(minutes=5 - i))
    events = await insp.scheduler_enqueue_events("e1", size=2)
    assert [e.task_id for e in events] == ["task-4", "task-3"]
    assert events[0].enqueued_at == NOW - timedelta(minutes=1)
    page3 = await insp.scheduler_enqueue_events("e1", page=3, size=2)
    assert [e.task_id for e in page3] == ["task-0"]


# -- Redis Cluster and connections ------------------------------------------------------------


async def test_cluster_key_slot_needs_cluster(redis: Redis, insp: Inspector) -> None:
    await go.register_queue(redis, "default")
    try:
        await redis.execute_command("CLUSTER", "KEYSLOT", "x")
    except ResponseError:
        pass  # Redis, Valkey 8: cluster support disabled
    else:
        # Valkey 9 computes CLUSTER KEYSLOT without cluster mode; the Inspector passes
        # the server's answer on, as Go asynq's Inspector does.
        assert await insp.cluster_key_slot("default") == key_slot(b"asynq:{default}:pending")
        return
    with pytest.raises(FailedPreconditionError, match="not running in cluster mode"):
        await insp.cluster_key_slot("default")


async def test_cluster_key_slot_and_nodes() -> None:
    name, version = server_binary().version().split()
    if name == "Redis" and tuple(int(p) for p in version.split(".")[:2]) < (7, 0):
        pytest.skip(f"--cluster-port (below) is a Redis 7.0 option; this is Redis {version}")
    # The bus port defaults to port + 10000, which overflows for high free ports.
    args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
    server = RedisServer(extra_args=[*args, "--cluster-port", str(free_port())]).start()
    try:
        client = Redis.from_url(server.url)
        await client.execute_command("CLUSTER ADDSLOTSRANGE", 0, 16383)
        for _ in range(200):  # writes are refused until the cluster state turns ok
            if (await client.execute_command("CLUSTER INFO")).get("cluster_state") == "ok":
                break
            await asyncio.sleep(0.05)
        await client.sadd("asynq:queues", "default")
        async with Inspector(client) as insp:
            assert await insp.cluster_key_slot("default") == key_slot(b"asynq:{default}:pending")
            (node,) = await insp.cluster_nodes("default")
            assert node.addr == f"127.0.0.1:{server.port}" and len(node.id) == 40
        await client.aclose()
    finally:
        server.cleanup()


async def test_inspector_from_url_owns_its_client(redis_url: str, redis: Redis) -> None:
    await go.register_queue(redis, "default")
    async with Inspector(redis_url) as insp:
        assert await insp.queues() == ["default"]
    # A client passed in stays open after aclose().
    insp2 = Inspector(redis)
    await insp2.aclose()
    assert await redis.ping()


def test_inspector_rejects_decoded_clients(redis_url: str) -> None:
    with pytest.raises(ValueError, match="decode_responses=False"):
        Inspector(Redis.from_url(redis_url, decode_responses=True))
    with pytest.raises(ValueError, match="unsupported uri scheme"):
        Inspector("http://localhost")


async def test_deletes_leave_a_wrong_typed_key_at_a_lock_name_alone(
    redis: Redis, insp: Inspector
) -> None:
    """A key of another type where a task's uniqueness lock would be is no lock of the
    task's: deleting every task of a state, or the whole queue, leaves that key and goes
    on, instead of stopping half-way on GET's WRONGTYPE. Deleting that one task is
    refused before any write, naming the key."""
    foreign = "asynq:{default}:unique:foreign"

    async def seed(state: str, names: tuple[str, ...]) -> list[GoTask]:
        tasks = [GoTask(n, unique_key=foreign if n == "odd" else f"{foreign}:{n}") for n in names]
        for t in tasks:
            await SEEDERS[state](redis, t)
        await redis.delete(foreign)
        await redis.hset(foreign, "not", "a lock")
        return tasks

    for state in ("pending", "scheduled", "retry", "archived"):
        tasks = await seed(state, ("odd", "plain"))
        assert await insp.delete_all("default", state) == 2
        assert not await redis.exists(*(t.key for t in tasks))
        assert await redis.hgetall(foreign) == {b"not": b"a lock"}
    (odd,) = await seed("scheduled", ("odd",))
    with pytest.raises(BrokerError, match=re.escape(foreign)):
        await insp.delete_task("default", odd.id)
    assert await redis.zrange("asynq:{default}:scheduled", 0, -1) == [odd.id.encode()]
    await redis.delete(foreign)
    await insp.delete_task("default", odd.id)
    assert not await redis.exists(odd.key)
    await redis.hset(foreign, "not", "a lock")
    await seed("pending", ("odd", "plain"))
    await insp.delete_queue("default", force=True)
    assert sorted(await redis.keys("*")) == [foreign.encode()]
