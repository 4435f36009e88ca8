"""Inspector on Redis states built by asyncq itself: the Broker, the Client and a Server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from asyncq import Intervals
from asyncq._broker import BatchItem, Broker
from asyncq._inspection.inspector import Inspector
from asyncq._producer.client import Client
from asyncq._time import GO_ZERO_TIME
from asyncq._worker.server import Server
from asyncq.mux import ServeMux
from asyncq.proto.asynq import (
    SchedulerEnqueueEvent,
    SchedulerEntry,
    ServerInfo,
    TaskMessage,
    WorkerInfo,
)
from asyncq.task import Task, TaskState
from tests.support import transitions

NOW = datetime.now(UTC).replace(microsecond=0)


def message(
    type_: str = "t", payload: bytes = b"p", queue: str = "default", **kw: object
) -> TaskMessage:
    return TaskMessage(
        type=type_, payload=payload, id=str(uuid.uuid4()), queue=queue, retry=25,
        timeout=1800, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.fixture
async def insp(redis: Redis) -> AsyncIterator[Inspector]:
    async with Inspector(redis) as inspector:
        yield inspector


async def test_every_state_through_the_broker(
    redis: Redis, broker: Broker, insp: Inspector
) -> None:
    pending = [message(payload=b"%d" % i) for i in range(3)]
    for m in pending:
        await broker.enqueue(m)
    scheduled = message("s")
    await broker.schedule(scheduled, NOW + timedelta(minutes=10))
    grouped = [message("g", group_key="grp") for _ in range(2)]
    for m in grouped:
        await broker.write(BatchItem(m, group="grp"))

    # Take three: two fail (retry, archive), one succeeds with retention.
    got = await transitions.dequeue_many(broker, ["default"], 3)
    assert [d.message.id for d in got] == [m.id for m in pending]
    info = await insp.queue_info("default")
    assert (info.pending, info.active, info.scheduled, info.aggregating) == (0, 3, 1, 2)
    active = await insp.list_active("default")
    assert [t.id for t in active] == [m.id for m in pending]
    assert not any(t.is_orphaned for t in active)

    await broker.retry(got[0].message, NOW + timedelta(minutes=1), "boom", is_failure=True)
    await broker.archive(got[1].message, "fatal")
    done = got[2].message
    done.retention = 3600
    await broker.write_result("default", done.id, b"result!")
    await broker.mark_as_complete(done)

    (retry,) = await insp.list_retry("default")
    assert (retry.id, retry.retried, retry.last_error) == (pending[0].id, 1, "boom")
    assert retry.next_process_at == NOW + timedelta(minutes=1)
    (archived,) = await insp.list_archived("default")
    assert archived.id == pending[1].id and archived.last_error == "fatal"
    (completed,) = await insp.list_completed("default")
    assert completed.result == b"result!" and completed.completed_at is not None
    assert completed.retention == timedelta(hours=1)
    info = await insp.queue_info("default")
    assert (info.retry, info.archived, info.completed, info.active) == (1, 1, 1, 0)
    assert (info.processed, info.failed) == (3, 2)
    assert (info.processed_total, info.failed_total) == (3, 2)
    assert [(g.group, g.size) for g in await insp.groups("default")] == [("grp", 2)]
    agg = await insp.list_aggregating("default", "grp")
    assert {t.id for t in agg} == {m.id for m in grouped}

    # What the Inspector moves, the broker processes.
    await insp.run_task("default", archived.id)
    await insp.run_all("default", "aggregating", group="grp")
    again = await transitions.dequeue_many(broker, ["default"], 10)
    assert [d.message.id for d in again] == [archived.id, *(t.id for t in agg)]


async def test_latency_and_orphans_with_a_moving_clock(redis: Redis, broker: Broker) -> None:
    now = NOW.timestamp()
    broker.clock = lambda: now
    m = message()
    await broker.enqueue(m)
    async with Inspector(redis, clock=lambda: now + 42) as insp:
        info = await insp.queue_info("default")
        assert abs(info.latency.total_seconds() - 42) < 0.01
    await transitions.dequeue(broker, ["default"])
    async with Inspector(redis, clock=lambda: now + 31) as insp:
        (t,) = await insp.list_active("default")
        assert t.is_orphaned  # the 30 s lease ran out without an extension


async def test_client_enqueue_matches_get_task(redis: Redis, insp: Inspector) -> None:
    async with Client(redis) as client:
        created = await client.enqueue(
            Task("email:welcome", b'{"id": 1}', headers={"trace": "x"}),
            queue="critical",
            max_retry=3,
            timeout=timedelta(minutes=2),
            process_in=timedelta(hours=1),
            retention=timedelta(days=1),
        )
    got = await insp.get_task("critical", created.id)
    assert got.state is TaskState.SCHEDULED
    for field in ("id", "queue", "type", "payload", "max_retry", "timeout", "retention"):
        assert getattr(got, field) == getattr(created, field), field
    assert got.headers == {"trace": "x"}
    assert got.next_process_at == created.next_process_at.replace(microsecond=0)  # type: ignore[union-attr]
    updated = await insp.update_task_payload("critical", created.id, b'{"id": 2}')
    assert updated.payload == b'{"id": 2}' and updated.headers == {"trace": "x"}


async def test_servers_and_schedulers_written_by_the_broker(
    broker: Broker, insp: Inspector
) -> None:
    info = ServerInfo(
        host="h", pid=7, server_id="sid", concurrency=4, queues={"default": 1},
        status="active", start_time=NOW, active_worker_count=1,
    )  # fmt: skip
    worker = WorkerInfo(
        host="h", pid=7, server_id="sid", task_id="tid", task_type="t", task_payload=b"x",
        queue="default", start_time=NOW, deadline=NOW + timedelta(minutes=30),
    )  # fmt: skip
    await broker.write_server_state(info, [worker], 10)
    (server,) = await insp.servers()
    assert (server.id, server.concurrency, server.status) == ("sid", 4, "active")
    assert [w.task_id for w in server.active_workers] == ["tid"]
    await broker.clear_server_state("h", 7, "sid")
    assert await insp.servers() == []

    entry = SchedulerEntry(
        id="e", spec="* * * * *", task_type="t", enqueue_options=["MaxRetry(1)"],
        next_enqueue_time=NOW + timedelta(minutes=1), prev_enqueue_time=GO_ZERO_TIME,
    )  # fmt: skip
    await broker.write_scheduler_entries("sched", [entry], 20)
    for i in range(3):
        event = SchedulerEnqueueEvent(task_id=f"t{i}", enqueue_time=NOW + timedelta(seconds=i))
        await broker.record_scheduler_enqueue_event("e", event)
    (e,) = await insp.scheduler_entries()
    assert e.options == ["MaxRetry(1)"] and e.prev is None
    events = await insp.scheduler_enqueue_events("e")
    assert [ev.task_id for ev in events] == ["t2", "t1", "t0"]


async def test_run_task_wakes_an_idle_server(redis: Redis, redis_url: str, insp: Inspector) -> None:
    handled: list[bytes] = []
    mux = ServeMux()

    @mux.handler("wake")
    async def handle(task: Task) -> None:
        handled.append(task.payload or b"")

    async with Client(redis) as client:
        archived = await client.enqueue(Task("wake", b"later"), process_in=timedelta(hours=1))
    await insp.archive_task("default", archived.id)
    server = Server(
        redis_url,
        concurrency=2,
        intervals=Intervals(task_check=timedelta(seconds=30), heartbeat=timedelta(seconds=1)),
    )
    await server.start(mux)
    try:
        for _ in range(200):  # the server is up once its heartbeat shows in servers()
            if await insp.servers():
                break
            await asyncio.sleep(0.05)
        await insp.run_task("default", archived.id)
        # The server polls only every 30 s; the wakeup publish gets it going at once.
        for _ in range(200):
            if handled:
                break
            await asyncio.sleep(0.05)
        assert handled == [b"later"]
    finally:
        await server.shutdown()
