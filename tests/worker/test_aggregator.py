"""Group aggregation (spec 3.3, 5.10): by size, by delay, by grace period, a failing
aggregator, and a server killed in the middle of an aggregation."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import structlog
from redis.asyncio import Redis

from asyncq import Aggregation
from asyncq import _keys as keys
from asyncq._producer.client import Client
from asyncq._worker.server import Server
from asyncq.mux import ServeMux
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task
from tests.support.procs import FAST, spawn, stop_process, wait_for_line, wait_until
from tests.support.workers.worker import AGGREGATING

Q = "default"
READY = "send signal TERM or INT"


class Recorder:
    """An aggregator joining payloads, and the handler of the aggregated task."""

    def __init__(self, *, fail_first: int = 0) -> None:
        self.calls: list[tuple[str, list[bytes]]] = []
        self.processed: list[tuple[bytes, str]] = []
        self.fail_first = fail_first

    async def aggregate(self, group: str, tasks: Sequence[Task]) -> Task:
        # Group scores are whole seconds; within a second asynq orders by task ID, so
        # the payloads are sorted to keep the assertions independent of random IDs.
        payloads = sorted(t.payload or b"" for t in tasks)
        self.calls.append((group, payloads))
        if len(self.calls) <= self.fail_first:
            raise ValueError("aggregator bug")
        # The aggregate's own queue option is overridden by the group's queue.
        return Task("batch", b",".join(payloads), queue="elsewhere")

    def mux(self) -> ServeMux:
        mux = ServeMux()

        async def handle(task: Task) -> None:
            self.processed.append((task.payload or b"", task.queue or ""))

        mux.handle("batch", handle)
        return mux


def agg_server(redis: Redis, rec: Recorder, **options: Any) -> Server:
    """A fast Server aggregating with *rec*: *options* are ``Aggregation`` fields over
    these defaults, and ``queues``."""
    queues = {"queues": options.pop("queues")} if "queues" in options else {}
    aggregation = Aggregation(
        aggregator=rec.aggregate,
        check_interval=timedelta(milliseconds=100),
        grace_period=timedelta(minutes=1),
    )
    return Server(redis, **FAST, **queues, aggregation=replace(aggregation, **options))


async def add(client: Client, group: str, *payloads: bytes, queue: str = Q) -> None:
    for p in payloads:
        await client.enqueue(Task("item", p), group=group, queue=queue)


async def test_aggregation_by_max_size(redis: Redis, client: Client) -> None:
    rec = Recorder()
    server = agg_server(redis, rec, max_size=3, queues={"mail": 1})
    async with server:
        await server.start(rec.mux())
        await add(client, "digest", b"1", b"2", b"3", b"4", b"5", queue="mail")
        await wait_until(lambda: rec.processed, what="aggregate processed")
        # Scores are whole seconds, so within one second the order is by task ID (as asynq).
        [(group, payloads)] = rec.calls
        assert group == "digest" and len(payloads) == 3
        assert rec.processed == [(b",".join(payloads), "mail")]  # into the group's queue
        # The other two wait for more tasks: neither size, delay nor grace is reached.
        left = await redis.zrange(keys.group_key("mail", "digest"), 0, -1)
        left_payloads = [
            (await redis.hget(keys.task_key("mail", tid.decode()), "msg")) for tid in left
        ]
        assert len(left_payloads) == 2
        assert sorted(payloads + [TaskMessage.parse(m).payload for m in left_payloads]) == [
            b"1",
            b"2",
            b"3",
            b"4",
            b"5",
        ]
        assert await redis.sismember(keys.all_groups("mail"), "digest")
    # Staged tasks are deleted once the aggregate is enqueued.
    assert await redis.zcard(keys.all_aggregation_sets("mail")) == 0
    assert server.stats.aggregated == 1


async def test_aggregation_by_max_delay(redis: Redis, client: Client) -> None:
    rec = Recorder()
    server = agg_server(redis, rec, max_delay=timedelta(seconds=1))
    async with server:
        await server.start(rec.mux())
        await add(client, "g", b"a", b"b")
        await wait_until(lambda: rec.processed, within=15, what="aggregate processed")
    assert rec.calls == [("g", [b"a", b"b"])]
    assert rec.processed == [(b"a,b", Q)]
    assert await redis.zcard(keys.group_key(Q, "g")) == 0


async def test_aggregation_by_grace_period(redis: Redis, client: Client) -> None:
    rec = Recorder()
    server = agg_server(redis, rec, grace_period=timedelta(seconds=1))
    async with server:
        await server.start(rec.mux())
        await add(client, "g", b"x", b"y", b"z")
        await wait_until(lambda: rec.processed, within=15, what="aggregate processed")
    assert rec.calls == [("g", [b"x", b"y", b"z"])]
    assert not await redis.sismember(keys.all_groups(Q), "g")


async def stage_deadline_passed(redis: Redis, queue: str = Q) -> list[bytes]:
    """Make every staged aggregation set look older than its 2-minute deadline."""
    sets = await redis.zrange(keys.all_aggregation_sets(queue), 0, -1)
    for member in sets:
        await redis.zadd(keys.all_aggregation_sets(queue), {member: int(time.time()) - 1})
    return sets


async def test_failing_aggregator_loses_no_task(redis: Redis, client: Client) -> None:
    rec = Recorder(fail_first=1)
    with structlog.testing.capture_logs() as logs:
        server = agg_server(redis, rec, grace_period=timedelta(seconds=1))
        async with server:
            await server.start(rec.mux())
            await add(client, "g", b"1", b"2")
            await wait_until(lambda: server.stats.aggregation_errors == 1, what="failure")
            # The tasks stay staged, with their hashes, until the set's deadline.
            sets = await redis.zrange(keys.all_aggregation_sets(Q), 0, -1)
            assert len(sets) == 1
            assert await redis.zcard(sets[0]) == 2
            await stage_deadline_passed(redis)
            # The recoverer puts them back into the group; the next check aggregates them.
            await wait_until(lambda: rec.processed, within=15, what="aggregate processed")
    assert [c[1] for c in rec.calls] == [[b"1", b"2"], [b"1", b"2"]]
    assert rec.processed == [(b"1,2", Q)]
    failures = [e for e in logs if e["event"].startswith("aggregation failed")]
    assert failures and failures[0]["log_level"] == "error" and failures[0]["group"] == "g"


async def test_aggregator_returning_a_non_task_is_a_failure(redis: Redis, client: Client) -> None:
    def bad(group: str, tasks: Sequence[Task]) -> Any:
        return "not a task"

    server = Server(
        redis,
        **FAST,
        aggregation=Aggregation(
            aggregator=bad,
            grace_period=timedelta(seconds=1),
            check_interval=timedelta(milliseconds=100),
        ),
    )
    async with server:
        await server.start(ServeMux())
        await add(client, "g", b"1")
        await wait_until(lambda: server.stats.aggregation_errors >= 1, what="failure")
    assert await redis.zcard(keys.all_aggregation_sets(Q)) == 1


@pytest.mark.slow
@pytest.mark.subprocess
async def test_server_killed_during_aggregation_loses_no_task(
    redis_url: str, redis: Redis, client: Client
) -> None:
    proc = spawn(
        "worker.py", redis_url, "aggregate=block", "grace=1", "check_interval=0.1", "heartbeat=0.2"
    )
    try:
        await wait_for_line(proc, READY)
        await add(client, "g", b"a", b"b", b"c")
        await wait_until(lambda: redis.exists(AGGREGATING), within=15, what="aggregating")
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 10)
    finally:
        stop_process(proc)
    # Killed mid-aggregation: the three tasks are staged, none lost.
    sets = await redis.zrange(keys.all_aggregation_sets(Q), 0, -1)
    assert len(sets) == 1
    ids = [m.decode() for m in await redis.zrange(sets[0], 0, -1)]
    assert len(ids) == 3
    for tid in ids:
        assert await redis.hget(keys.task_key(Q, tid), "state") == b"aggregating"
    await stage_deadline_passed(redis)

    rec = Recorder()
    server = agg_server(redis, rec, grace_period=timedelta(seconds=1))
    async with server:
        await server.start(rec.mux())
        await wait_until(lambda: rec.processed, within=15, what="aggregate processed")
    assert rec.processed == [(b"a,b,c", Q)]
    assert await redis.zcard(keys.all_aggregation_sets(Q)) == 0
    for tid in ids:
        assert not await redis.exists(keys.task_key(Q, tid))
