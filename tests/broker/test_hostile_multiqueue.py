"""One damaged queue does not stop the worker's multi-queue passes for the others (issue 25).

The forwarder, recoverer, janitor and the aggregation-set reclaim run one script call
over all of a worker's queues. A key of another type in one queue (written by a buggy
client or an operator) used to fail the whole call, so no queue was forwarded,
recovered or cleaned, and the log named no key. Now the damaged queue is skipped
before anything of it is written, the healthy queues of the same call are handled,
and one warning names the damaged key.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from structlog.testing import capture_logs

from asyncq import Inspector, TaskState
from asyncq import _keys as keys
from asyncq._broker import Broker
from tests.support.helpers import FakeClock, make_msg, snapshot

BAD, GOOD = "bad", "good"
QUEUES = [BAD, GOOD]  # the damaged queue comes first in the call


def _named(logs: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The warnings whose text names *key*."""
    return [e for e in logs if e["log_level"] == "warning" and key in repr(e)]


async def _damage(redis: Redis, key: str, kind: str) -> None:
    """Replace *key* by a value of another type than *kind*."""
    await redis.delete(key)
    if kind == "string":
        await redis.hset(key, "x", "y")
    else:
        await redis.set(key, b"\xff not a " + kind.encode())


async def _bad_queue_with_due_task(broker: Broker, redis: Redis, clock: FakeClock) -> None:
    await broker.schedule(make_msg("b1", BAD), clock.dt - timedelta(seconds=5))
    await broker.enqueue(make_msg("b0", BAD))


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        (keys.scheduled_key(BAD), "zset"),
        (keys.pending_key(BAD), "list"),
        (keys.all_groups(BAD), "set"),
        (keys.task_key(BAD, "b1"), "hash"),
    ],
)
async def test_forward_moves_a_healthy_queue_beside_a_damaged_one(
    broker: Broker, redis: Redis, clock: FakeClock, key: str, kind: str
) -> None:
    await _bad_queue_with_due_task(broker, redis, clock)
    await broker.schedule(make_msg("g1", GOOD), clock.dt - timedelta(seconds=5))
    await _damage(redis, key, kind)
    before = {k: v for k, v in (await snapshot(redis)).items() if "{bad}" in k}

    with capture_logs() as logs:
        moved = await broker.forward_queues(QUEUES)

    assert moved == 1
    assert await redis.lrange(keys.pending_key(GOOD), 0, -1) == [b"g1"]
    assert await redis.zcard(keys.scheduled_key(GOOD)) == 0
    assert await redis.hget(keys.task_key(GOOD, "g1"), "state") == b"pending"
    # Nothing of the damaged queue was written.
    assert {k: v for k, v in (await snapshot(redis)).items() if "{bad}" in k} == before
    warned = _named(logs, key)
    assert len(warned) == 1, logs
    assert warned[0]["key"] == key
    assert f"WRONGTYPE {key} is not a {kind}" in warned[0]["problems"]


async def test_forward_skips_a_queue_whose_due_tasks_group_is_damaged(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # The group a due task names is checked before the queue's first write: the
    # damaged queue is skipped whole, the healthy one forwarded.
    await _bad_queue_with_due_task(broker, redis, clock)
    await redis.hset(keys.task_key(BAD, "b1"), "group", "grp")
    await broker.schedule(make_msg("g1", GOOD), clock.dt - timedelta(seconds=5))
    key = keys.group_key(BAD, "grp")
    await _damage(redis, key, "zset")
    before = {k: v for k, v in (await snapshot(redis)).items() if "{bad}" in k}

    with capture_logs() as logs:
        assert await broker.forward_queues(QUEUES) == 1

    assert await redis.lrange(keys.pending_key(GOOD), 0, -1) == [b"g1"]
    assert {k: v for k, v in (await snapshot(redis)).items() if "{bad}" in k} == before
    warned = _named(logs, key)
    assert len(warned) == 1, logs
    assert warned[0]["problems"] == [f"WRONGTYPE {key} is not a zset"]


async def test_forward_warnings_about_one_key_are_rate_limited(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await _bad_queue_with_due_task(broker, redis, clock)
    await _damage(redis, keys.retry_key(BAD), "zset")
    with capture_logs() as logs:
        for _ in range(5):
            await broker.forward_queues(QUEUES)
    assert len(_named(logs, keys.retry_key(BAD))) == 1, logs


@pytest.mark.parametrize("damaged", ["lease", "task"])
async def test_lease_scan_lists_a_healthy_queue_beside_a_damaged_one(
    broker: Broker, redis: Redis, clock: FakeClock, damaged: str
) -> None:
    await broker.enqueue(make_msg("b1", BAD))
    await broker.enqueue(make_msg("g1", GOOD))
    await broker.enqueue(make_msg("g2", GOOD))
    taken = await broker.fetch(QUEUES, 3)
    assert len(taken.tasks) == 3
    key = keys.lease_key(BAD) if damaged == "lease" else keys.task_key(BAD, "b1")
    await _damage(redis, key, "zset" if damaged == "lease" else "hash")
    clock.now += broker.lease_duration + 10

    with capture_logs() as logs:
        expired, _ = await broker.scan_leases(clock.dt, QUEUES)

    assert sorted((q, m.id) for q, m in expired) == [(GOOD, "g1"), (GOOD, "g2")]
    warned = _named(logs, key)
    assert len(warned) == 1, logs
    assert warned[0]["key"] == key


async def test_janitor_deletes_a_healthy_queues_expired_tasks_beside_a_damaged_one(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    for qname in QUEUES:
        await broker.enqueue(make_msg(f"{qname}1", qname, retention=10))
    for task in (await broker.fetch(QUEUES, 2)).tasks:
        await broker.mark_as_complete(task.message)
    key = keys.completed_key(BAD)
    await _damage(redis, key, "zset")
    clock.now += 60

    with capture_logs() as logs:
        deleted = await broker.delete_expired_completed_queues(QUEUES)

    assert deleted == 1
    assert not await redis.exists(keys.task_key(GOOD, "good1"))
    assert await redis.zcard(keys.completed_key(GOOD)) == 0
    assert await redis.exists(keys.task_key(BAD, "bad1"))
    warned = _named(logs, key)
    assert len(warned) == 1, logs
    assert warned[0]["key"] == key


@pytest.mark.parametrize("damaged", ["sets", "set", "group", "groups"])
async def test_reclaim_restores_a_healthy_queues_set_beside_a_damaged_one(
    broker: Broker, redis: Redis, clock: FakeClock, damaged: str
) -> None:
    past = clock.now - 100
    for qname in QUEUES:
        set_key = keys.aggregation_set_key(qname, "grp", "s1")
        await redis.zadd(set_key, {f"{qname}-t1": 5.0})
        await redis.zadd(keys.all_aggregation_sets(qname), {set_key: past})
    key, kind = {
        "sets": (keys.all_aggregation_sets(BAD), "zset"),
        "set": (keys.aggregation_set_key(BAD, "grp", "s1"), "zset"),
        "group": (keys.group_key(BAD, "grp"), "zset"),
        "groups": (keys.all_groups(BAD), "set"),
    }[damaged]
    await _damage(redis, key, kind)
    before = {k: v for k, v in (await snapshot(redis)).items() if "{bad}" in k}

    with capture_logs() as logs:
        await broker.reclaim_stale_aggregation_sets_queues(QUEUES)

    assert await redis.zrange(keys.group_key(GOOD, "grp"), 0, -1, withscores=True) == [
        (b"good-t1", 5.0)
    ]
    assert await redis.smembers(keys.all_groups(GOOD)) == {b"grp"}
    assert not await redis.exists(keys.aggregation_set_key(GOOD, "grp", "s1"))
    assert await redis.zcard(keys.all_aggregation_sets(GOOD)) == 0
    assert {k: v for k, v in (await snapshot(redis)).items() if "{bad}" in k} == before
    warned = _named(logs, key)
    assert len(warned) == 1, logs
    assert warned[0]["key"] == key


async def test_a_script_refused_for_a_wrong_type_names_the_key(redis: Redis) -> None:
    """Redis' own WRONGTYPE error names no key: the script runner finds and names it."""
    await redis.sadd(keys.ALL_QUEUES, "q")
    await redis.set(keys.scheduled_key("q"), "not a zset")
    async with Inspector(redis) as inspector:
        with pytest.raises(ResponseError, match=r"WRONGTYPE asynq:\{q\}:scheduled is not a zset"):
            await inspector.queue_info("q")
        with pytest.raises(ResponseError, match=r"WRONGTYPE asynq:\{q\}:scheduled is not a zset"):
            await inspector.list_tasks("q", TaskState.SCHEDULED)


async def test_forward_names_the_first_damaged_set_of_a_queue(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # The scheduled set is read first; once it is found damaged the queue is skipped
    # and the retry set (damaged too) is not read, so one key is named.
    await broker.schedule(make_msg("g1", GOOD), clock.dt - timedelta(seconds=5))
    scheduled, retry = keys.scheduled_key(BAD), keys.retry_key(BAD)
    await _damage(redis, scheduled, "zset")
    await _damage(redis, retry, "zset")

    with capture_logs() as logs:
        assert await broker.forward_queues(QUEUES) == 1

    assert await redis.lrange(keys.pending_key(GOOD), 0, -1) == [b"g1"]
    warned = _named(logs, scheduled)
    assert len(warned) == 1, logs
    assert warned[0]["problems"] == [f"WRONGTYPE {scheduled} is not a zset"]
    assert _named(logs, retry) == []


async def test_forward_with_nothing_due_does_not_read_a_damaged_pending_list(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # Only the keys a due task would be written to are checked: with nothing due the
    # queue has nothing to skip and nothing to warn about.
    await broker.schedule(make_msg("b1", BAD), clock.dt + timedelta(hours=1))
    await _damage(redis, keys.pending_key(BAD), "list")
    before = await snapshot(redis)

    with capture_logs() as logs:
        assert await broker.forward_queues(QUEUES) == 0

    assert await snapshot(redis) == before
    assert [e for e in logs if e["log_level"] == "warning"] == []


async def test_reclaim_with_no_stale_set_does_not_read_a_damaged_groups_set(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # Only the keys a stale set would be written back to are checked: with every set
    # before its deadline the queue has nothing to skip and nothing to warn about.
    set_key = keys.aggregation_set_key(BAD, "grp", "s1")
    await redis.zadd(set_key, {"b1": 5.0})
    await redis.zadd(keys.all_aggregation_sets(BAD), {set_key: clock.now + 100})
    await _damage(redis, keys.all_groups(BAD), "set")
    before = await snapshot(redis)

    with capture_logs() as logs:
        await broker.reclaim_stale_aggregation_sets_queues(QUEUES)

    assert await snapshot(redis) == before
    assert [e for e in logs if e["log_level"] == "warning"] == []


@pytest.mark.parametrize(
    "member",
    [
        keys.group_key(BAD, "grp"),  # a group, not one of its sets
        keys.aggregation_set_key(GOOD, "grp", "s1"),  # another queue's set
        "asynq:{bad}:grp:s1",  # not under the queue's group prefix
    ],
)
async def test_reclaim_skips_a_queue_whose_stale_entry_is_not_one_of_its_sets(
    broker: Broker, redis: Redis, clock: FakeClock, member: str
) -> None:
    await redis.zadd(member, {"b1": 5.0})
    await redis.zadd(keys.all_aggregation_sets(BAD), {member: clock.now - 100})
    before = await snapshot(redis)

    with capture_logs() as logs:
        await broker.reclaim_stale_aggregation_sets_queues(QUEUES)

    assert await snapshot(redis) == before
    warned = _named(logs, member)
    assert len(warned) == 1, logs
    assert "not an aggregation set of a group of this queue" in repr(warned[0])
