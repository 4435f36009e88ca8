"""A running Server, a Scheduler and a killed worker on the three-master Redis Cluster.

The queue names are chosen so that their hash slots land on every master (checked
against the cluster's own slot map), so each role's multi-key scripts run on every node.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from asyncq import Aggregation, Client, Inspector, Limits, Scheduler, ServeMux, Server, Task
from tests.support.cluster import RedisClusterProcs
from tests.support.procs import FAST, fast, spawn, stop_process, wait_for_line, wait_until
from tests.support.workers.worker import STARTS

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.xdist_group("cluster-server")]

# Slots 5275, 8090 and 15214: one per master of a three-master cluster.
QUEUES = {"video": 3, "critical": 2, "low": 1}
READY = "send signal TERM or INT"


def p(queue: str) -> str:
    return f"asynq:{{{queue}}}:"


@pytest.fixture
async def rc(cluster: RedisClusterProcs) -> AsyncIterator[RedisCluster]:
    """A raw cluster client on flushed masters."""
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    try:
        yield client
    finally:
        await client.aclose()


def test_queue_names_land_on_every_master(cluster: RedisClusterProcs) -> None:
    masters = cluster.master_ports()
    assert len(masters) == 3
    owners = {q: cluster.master_port_of(p(q) + "pending") for q in QUEUES}
    assert set(owners.values()) == masters, owners
    # Every key of one queue lives on that queue's master.
    for q, port in owners.items():
        for suffix in ("t:x", "active", "lease", "scheduled", "retry", "g:g", "groups"):
            assert cluster.master_port_of(p(q) + suffix) == port


async def test_server_roles_and_scheduler_on_a_cluster(
    cluster: RedisClusterProcs, rc: RedisCluster
) -> None:
    handled: list[tuple[str, str, bytes, int]] = []

    async def record(task: Task) -> None:
        assert task.id is not None and task.queue is not None
        handled.append((task.type, task.queue, task.payload, task.retry_count))
        if task.type == "flaky" and task.retry_count == 0:
            raise RuntimeError("first attempt fails")

    async def join(group: str, tasks: Sequence[Task]) -> Task:
        return Task("joined", b",".join(t.payload for t in tasks))

    mux = ServeMux()
    for task_type in ("work", "flaky", "joined", "tick"):
        mux.handle(task_type, record)

    async with Client(cluster.url) as client:
        for q in QUEUES:
            await client.enqueue_many([(Task("work", q.encode()), {"queue": q}) for _ in range(5)])
            await client.enqueue(Task("work", b"later"), queue=q, process_in=timedelta(seconds=1))
            await client.enqueue(Task("flaky", q.encode()), queue=q)
            for i in range(3):
                await client.enqueue(Task("part", f"{q}:{i}".encode()), queue=q, group="g")

    server = Server(
        cluster.url,
        concurrency=6,
        queues=QUEUES,
        retry_delay=lambda n, err, task: timedelta(0),
        aggregation=Aggregation(
            aggregator=join,
            grace_period=timedelta(seconds=1),
            max_size=3,
            check_interval=timedelta(milliseconds=200),
        ),
        **FAST,
    )
    enqueued: list[str] = []

    def post_enqueue(info: Any, error: BaseException | None) -> None:
        assert error is None, error
        enqueued.append(info.id)

    scheduler = Scheduler(
        cluster.url,
        heartbeat_interval=timedelta(seconds=1),
        claim_lease=timedelta(seconds=1),
        post_enqueue=post_enqueue,
    )
    entry_id = scheduler.register("@every 1s", Task("tick", b"cron"), queue="low")
    await server.start(mux)
    try:
        await scheduler.start()
        try:
            async with Inspector(cluster.url) as insp:

                async def running() -> bool:
                    servers = await insp.servers()
                    entries = await insp.scheduler_entries()
                    return (
                        len(servers) == 1
                        and servers[0].queues == QUEUES
                        and [e.id for e in entries] == [entry_id]
                        and Counter(t for t, *_ in handled)["tick"] >= 2
                    )

                await wait_until(running, within=30, what="heartbeats and two scheduler ticks")
                # The enqueue history, as Go's Inspector reads it, while the scheduler runs.
                events = await insp.scheduler_enqueue_events(entry_id)
                assert {e.task_id for e in events} <= set(enqueued)
                assert len(events) >= 2
        finally:
            await scheduler.shutdown()

        async def drained() -> bool:
            counts = Counter((t, q) for t, q, *_ in handled)
            return all(
                counts[("work", q)] == 6 and counts[("flaky", q)] == 2 and counts[("joined", q)]
                for q in QUEUES
            ) and not await rc.llen(p("low") + "pending")

        await wait_until(drained, within=30, what="every task of every queue handled")
        await wait_until(
            lambda: Counter(t for t, *_ in handled)["tick"] == len(enqueued),
            within=10,
            what="every scheduled tick handled",
        )
    finally:
        await server.shutdown()

    ticks = len(enqueued)
    assert len(set(enqueued)) == ticks  # one task per tick
    for q in QUEUES:
        joined = [payload for t, queue, payload, _ in handled if t == "joined" and queue == q]
        # One aggregated task per queue holding the three parts (the group zset orders
        # members of the same second by id, as asynq's does).
        assert len(joined) == 1, joined
        assert sorted(joined[0].split(b",")) == [f"{q}:{i}".encode() for i in range(3)]
        flaky = [n for t, queue, _, n in handled if t == "flaky" and queue == q]
        assert flaky == [0, 1]
        # Nothing is left in any structure of the queue: done tasks' hashes are deleted,
        # the aggregated parts are gone with their group.
        for kind in ("pending", "active"):
            assert await rc.llen(p(q) + kind) == 0, (q, kind)
        for kind in ("lease", "scheduled", "retry", "archived", "completed", "g:g"):
            assert await rc.zcard(p(q) + kind) == 0, (q, kind)
        assert await rc.scard(p(q) + "groups") == 0
        assert await rc.zcard(p(q) + "aggregation_sets") == 0
        node = rc.get_node_from_key(p(q) + "pending")
        assert await rc.keys(p(q) + "t:*", target_nodes=node) == []
        extra = ticks if q == "low" else 0
        # 6 work + 2 flaky attempts + 1 joined (+ the ticks); 1 failure.
        assert int(await rc.get(p(q) + "processed")) == 9 + extra
        assert int(await rc.get(p(q) + "failed")) == 1
    # Both left nothing behind in the indexes: the server and scheduler records are cleared.
    assert await rc.zcard("asynq:servers") == 0
    assert await rc.zcard("asynq:workers") == 0
    assert await rc.zcard("asynq:schedulers") == 0


async def test_sigkilled_worker_tasks_recovered_on_a_cluster(
    cluster: RedisClusterProcs, rc: RedisCluster
) -> None:
    async with Client(cluster.url) as client:
        infos = [await client.enqueue(Task("block", b"")) for _ in range(4)]
    ids = {info.id for info in infos}
    timings = ["lease=2", "heartbeat=0.3", "task_check=0.1", "concurrency=4"]
    proc = spawn("worker.py", cluster.url, *timings)
    try:
        await wait_for_line(proc, READY)
        await wait_until(lambda: _llen_is(rc, STARTS, 4), within=20, what="all four tasks running")
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 10)
    finally:
        stop_process(proc)
    killed = str(proc.pid)
    assert sorted(s.decode() for s in await rc.lrange(STARTS, 0, -1)) == sorted(
        f"{i} {killed}" for i in ids
    )
    assert await rc.llen(p("default") + "active") == 4

    seen: list[tuple[str, int, str]] = []

    async def finish(task: Task) -> None:
        assert task.id is not None
        seen.append((task.id, task.retry_count, task.type))

    mux = ServeMux()
    mux.handle("block", finish)
    server = Server(
        cluster.url,
        concurrency=4,
        retry_delay=lambda n, err, task: timedelta(0),
        **fast(recoverer_cutoff=timedelta(milliseconds=500)),
    )
    await server.start(mux)
    try:
        await wait_until(lambda: len(seen) == 4, within=30, what="the killed worker's tasks")
        await wait_until(
            lambda: _settled(rc, "default"), within=10, what="the queue settling after recovery"
        )
    finally:
        await server.shutdown()
    assert sorted(seen) == sorted((i, 1, "block") for i in ids)
    assert server.stats.recovered == 4
    # Recovery counted each lease expiry as a processed failure, then each run as done.
    assert int(await rc.get(p("default") + "processed")) == 8
    assert int(await rc.get(p("default") + "failed")) == 4
    node = rc.get_node_from_key(p("default") + "pending")
    assert await rc.keys(p("default") + "t:*", target_nodes=node) == []


async def _llen_is(rc: RedisCluster, key: str, n: int) -> bool:
    return int(await rc.llen(key)) == n


async def _settled(rc: RedisCluster, q: str) -> bool:
    counts: list[Any] = [
        await rc.llen(p(q) + "pending"),
        await rc.llen(p(q) + "active"),
        await rc.zcard(p(q) + "lease"),
        await rc.zcard(p(q) + "retry"),
    ]
    return not any(counts)


async def test_patterns_and_type_rates_on_a_cluster(
    cluster: RedisClusterProcs, rc: RedisCluster
) -> None:
    # tenant:video, tenant:critical and tenant:low hash differently; whatever the
    # slots, the roles reach each queue on its own node.
    seen: list[tuple[str, int]] = []
    mux = ServeMux()

    @mux.handler("tick")
    async def tick(task: Task) -> None:
        seen.append((task.queue or "", task.retry_count))

    names = [f"tenant:{q}" for q in QUEUES]
    server = Server(
        rc,
        queues={"tenant:*": 1},
        limits=Limits(type_rate_limits={"tick": "2/s"}),
        **fast(queue_refresh=timedelta(milliseconds=100)),
    )
    async with server, Client(rc) as client:
        await server.start(mux)
        for name in names:  # created after the server started
            await client.enqueue_many([Task("tick", b"", queue=name, max_retry=0)] * 2)
        await wait_until(lambda: len(seen) == 6, within=60, what="tasks of every tenant queue")
        assert sorted(server.served_queues) == sorted(names)
        async with Inspector(rc) as insp:  # the server's record and the bucket, each on its node
            (info,) = await insp.type_rates()
            assert (info.task_type, info.rate, info.servers) == ("tick", "2/s", {"2/s": 1})
            assert info.tokens is not None and info.limited == server.stats.type_rate_limited
    assert Counter(q for q, _ in seen) == dict.fromkeys(names, 2)
    assert {r for _, r in seen} == {0}
