"""Extreme durations and Go-written extreme int64 values: an enqueue never writes and then
raises, and every reader clamps instead of failing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._inspection.inspector import Inspector
from asyncq._producer.client import Client
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task, TaskInfo, TaskState
from tests.support.procs import stored_message

Q = "default"
MAX_I64 = 2**63 - 1
TIMEDELTA_MAX_SECONDS = 86_399_999_999_999  # whole seconds of timedelta.max
TIMEDELTA_MIN_SECONDS = -86_399_999_913_600  # timedelta.min, -999999999 days
UTC_MAX = datetime.max.replace(tzinfo=UTC)
UTC_MIN = datetime.min.replace(tzinfo=UTC)


def message(task_type: str = "x", **fields: Any) -> TaskMessage:
    base: dict[str, Any] = {"queue": Q, "retry": 3, "timeout": 60}
    return TaskMessage(id=str(uuid.uuid4()), type=task_type, **{**base, **fields})


async def seed_pending(redis: Redis, qname: str, msg: TaskMessage) -> bytes:
    """Write a task hash and its pending id directly (the way another writer could)."""
    raw = bytes(msg)
    await redis.hset(keys.task_key(qname, msg.id), mapping={"msg": raw, "state": "pending"})
    await redis.rpush(keys.pending_key(qname), msg.id)  # the next one dequeued
    return raw


# -- 3. extreme durations and Go-written extreme values -----------------------------------------


async def test_timedelta_max_options_write_once_and_report_exactly(
    client: Client, redis: Redis
) -> None:
    top = timedelta(seconds=TIMEDELTA_MAX_SECONDS)
    info = await client.enqueue(Task("t", b"1"), timeout=timedelta.max)
    assert info.timeout == top
    assert (await stored_message(redis, Q, info.id)).timeout == TIMEDELTA_MAX_SECONDS

    info = await client.enqueue(Task("t", b"2"), retention=timedelta.max)
    assert info.retention == top
    assert (await stored_message(redis, Q, info.id)).retention == TIMEDELTA_MAX_SECONDS

    info = await client.enqueue(Task("t", b"3"), unique=timedelta.max)
    ttl = await redis.ttl(keys.unique_key(Q, "t", b"3"))
    assert TIMEDELTA_MAX_SECONDS - 60 < ttl <= TIMEDELTA_MAX_SECONDS

    results = await client.enqueue_many(
        [Task("t", b"4"), Task("t", b"5")], timeout=timedelta.max, retention=timedelta.max
    )
    assert all(isinstance(r, TaskInfo) and r.timeout == top for r in results), results
    assert await redis.llen(keys.pending_key(Q)) == 5  # each written exactly once


async def test_out_of_range_schedules_are_refused_before_any_write(
    client: Client, redis: Redis
) -> None:
    with pytest.raises(ValueError, match="process_in"):
        await client.enqueue(Task("t"), process_in=timedelta.max)
    with pytest.raises(ValueError, match="unique"):
        await client.enqueue(
            Task("t"), process_in=timedelta(days=1), unique=timedelta.max - timedelta(hours=1)
        )
    assert await redis.dbsize() == 0


def test_task_info_from_go_written_extremes_never_raises() -> None:
    msg = TaskMessage(
        id="x",
        queue=Q,
        type="t",
        timeout=MAX_I64,
        retention=MAX_I64,
        deadline=MAX_I64,
        last_failed_at=-(2**63),
        completed_at=253_402_300_800,  # 10000-01-01, one second past datetime.max
    )
    info = TaskInfo.from_message(msg, TaskState.COMPLETED, None)
    assert info.timeout == timedelta.max
    assert info.retention == timedelta.max
    assert info.deadline == UTC_MAX
    assert info.completed_at == UTC_MAX
    assert info.last_failed_at == UTC_MIN
    low = TaskInfo.from_message(
        TaskMessage(id="y", queue=Q, type="t", timeout=-(2**63), deadline=-62_135_596_800),
        TaskState.PENDING,
        None,
    )
    assert low.timeout == timedelta.min
    assert low.deadline == UTC_MIN  # Go's zero time, 0001-01-01


_I64 = st.integers(-(2**63), MAX_I64)


@given(_I64, _I64, _I64, _I64, _I64)
def test_task_info_accepts_any_int64(
    timeout: int, retention: int, deadline: int, failed_at: int, completed_at: int
) -> None:
    msg = TaskMessage(
        id="x",
        queue=Q,
        type="t",
        timeout=timeout,
        retention=retention,
        deadline=deadline,
        last_failed_at=failed_at,
        completed_at=completed_at,
    )
    info = TaskInfo.from_message(msg, TaskState.RETRY, None)
    for seconds, value in ((timeout, info.timeout), (retention, info.retention)):
        if seconds == 0:
            assert value is None
        elif TIMEDELTA_MIN_SECONDS <= seconds <= TIMEDELTA_MAX_SECONDS:
            assert value == timedelta(seconds=seconds)
        else:
            assert value == (timedelta.max if seconds > 0 else timedelta.min)
    for seconds, when in (
        (deadline, info.deadline),
        (failed_at, info.last_failed_at),
        (completed_at, info.completed_at),
    ):
        if seconds == 0:
            assert when is None
        else:
            assert when is not None and when.tzinfo is not None
            if UTC_MIN.timestamp() <= seconds <= UTC_MAX.timestamp():
                assert when == datetime.fromtimestamp(seconds, UTC)
            else:
                assert when == (UTC_MAX if seconds > 0 else UTC_MIN)


async def test_inspector_reads_a_go_written_task_with_extreme_values(
    redis: Redis, redis_url: str
) -> None:
    msg = message(timeout=MAX_I64, retention=MAX_I64, deadline=MAX_I64, completed_at=MAX_I64)
    await seed_pending(redis, Q, msg)
    await redis.sadd(keys.ALL_QUEUES, Q)
    async with Inspector(redis_url) as insp:
        info = await insp.get_task(Q, msg.id)
    assert info.timeout == timedelta.max
    assert info.deadline == UTC_MAX


def test_from_unix_clamps_every_int64() -> None:
    from datetime import UTC, datetime

    from asyncq._time import from_unix

    assert from_unix(0) is None
    assert from_unix(2**63 - 1) == datetime.max.replace(tzinfo=UTC)
    assert from_unix(-(2**63)) == datetime.min.replace(tzinfo=UTC)
    assert from_unix(1_700_000_000) == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
