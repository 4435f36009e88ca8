"""The aggregator enqueues aggregated tasks through the server's own Connection."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from redis.asyncio import Redis

from asyncq import Aggregation
from asyncq._producer.client import Client
from asyncq._worker.aggregator import GroupAggregatorRole
from asyncq._worker.server import Server
from asyncq.mux import ServeMux
from asyncq.task import Task
from tests.support.procs import FAST, wait_until

# -- 5. the aggregator enqueues through the server's Connection --------------------------------


async def test_aggregated_tasks_use_the_servers_connection(
    redis: Redis, redis_url: str, client: Client
) -> None:
    processed: list[bytes] = []

    async def aggregate(group: str, tasks: Sequence[Task]) -> Task:
        return Task("batch", b",".join(sorted(t.payload or b"" for t in tasks)))

    async def handle(task: Task) -> None:
        processed.append(task.payload or b"")

    mux = ServeMux()
    mux.handle("batch", handle)
    server = Server(
        redis_url,
        **FAST,
        aggregation=Aggregation(
            aggregator=aggregate,
            check_interval=timedelta(milliseconds=100),
            grace_period=timedelta(minutes=1),
            max_size=2,
        ),
    )
    await server.start(mux)
    try:
        for payload in (b"a", b"b"):
            await client.enqueue(Task("item", payload), group="g")
        await wait_until(lambda: processed == [b"a,b"], what="aggregated task processed")
        assert any(isinstance(r, GroupAggregatorRole) for r in server.roles)
        enqueuer = server._enqueuer
        assert enqueuer is not None
        assert server.connection.fast is not None  # a URL-built server has the fast transport
        assert enqueuer.broker.fast is server.connection.fast
    finally:
        await server.shutdown()
