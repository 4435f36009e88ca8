"""The metrics history counts recoveries where the recoverer decides them (issue 41,
item 3): a dead worker's task retried or archived by another worker's recoverer is a
processed, failed run, retried or archived, as ``asyncq stats`` counts it."""

from __future__ import annotations

from datetime import timedelta

import structlog
from redis.asyncio import Redis

from asyncq import Inspector, ServeMux, Server, Task
from asyncq._broker import Broker
from asyncq._producer.client import Client
from asyncq.history import HistoryRecorder
from tests.support.procs import FAST, wait_until

Q = "hist-recover"
LEASE = timedelta(seconds=1)


async def _held_by_a_dead_worker(redis: Redis, *, max_retry: int) -> str:
    """A task dequeued with a short lease by a "worker" that then never acknowledges
    it: what a SIGKILL leaves."""
    async with Client(redis) as client:
        info = await client.enqueue(Task("victim"), queue=Q, max_retry=max_retry)
    dead = Broker(redis, lease_duration=LEASE.total_seconds())
    fetched = await dead.fetch([Q], 1)
    assert [t.message.id for t in fetched.tasks] == [info.id]
    return info.id


async def test_a_dead_workers_task_counts_as_failed_and_retried_then_archived(
    redis: Redis,
) -> None:
    retried = await _held_by_a_dead_worker(redis, max_retry=3)
    archived = await _held_by_a_dead_worker(redis, max_retry=0)
    mux = ServeMux()
    mux.handle("other", lambda task: None)  # "victim" is never run here: it stays retried
    server = Server(
        redis,
        queues={Q: 1},
        metrics_history=True,
        retry_delay=lambda n, exc, task: timedelta(hours=1),
        **FAST,
    )
    await server.start(mux)
    try:
        async with Inspector(redis) as insp:

            async def recovered() -> bool:
                a = await insp.get_task(Q, retried)
                b = await insp.get_task(Q, archived)
                return (a.state.value, b.state.value) == ("retry", "archived")

            await wait_until(recovered, within=30, what="both tasks recovered")
    finally:
        await server.shutdown()  # the last flush
    async with Inspector(redis) as insp:
        (row,) = await insp.metrics_history(queues=[Q], window=timedelta(minutes=3))
    assert (row.task_type, row.processed, row.failed, row.retried, row.archived) == (
        "victim",
        2,
        2,
        1,
        1,
    )
    assert row.p50 is None and row.mean is None  # no run time to give


async def test_a_run_this_worker_still_holds_is_counted_once() -> None:
    # The processor counts the run when its handler ends; the recoverer adds the decision.
    recorder = HistoryRecorder(_NoStore(), log=structlog.get_logger())
    recorder.record("q", "t", 100.0, 101.0, True, False, False)  # the processor's "lost"
    recorder.record_recovered("q", "t", 102.0, ran_here=True, retried=True, archived=False)
    # a dead worker's
    recorder.record_recovered("q", "t", 102.0, ran_here=False, retried=False, archived=True)
    assert recorder._cells[(1, "q", "t")][:4] == [2, 2, 1, 1]


class _NoStore:
    async def write_history(self, *args: object) -> None:
        raise AssertionError("not flushed in this test")
