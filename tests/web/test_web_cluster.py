"""The web API on a Redis Cluster: the Redis page shows which node holds each queue."""

from __future__ import annotations

import httpx
import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from asyncq import Client, Inspector, Task
from asyncq.web import create_app
from tests.support.cluster import RedisClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("inspector-cluster")]


async def test_redis_api_maps_queues_to_nodes(cluster: RedisClusterProcs) -> None:
    async with Inspector(cluster.url) as insp:
        await insp.redis.flushall(target_nodes=RedisCluster.PRIMARIES)
    async with Client(cluster.url) as client:
        for q in ("critical", "default"):
            await client.enqueue(Task("t", b"x"), queue=q)
    app = create_app(cluster.url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h,
    ):
        data = (await h.get("/api/redis")).json()
        rows = {r["queue"]: r for r in data["cluster"]}
        assert set(rows) == {"critical", "default"}
        for q, row in rows.items():
            assert row["slot"] == key_slot(f"{{{q}}}".encode())
            assert row["nodes"], q
        page = await h.get("/redis")
        assert "Queue location (Redis Cluster)" in page.text
        queues = (await h.get("/api/queues")).json()["queues"]
        assert {q["queue"]: q["pending"] for q in queues} == {"critical": 1, "default": 1}
        metrics = await h.get("/metrics")
        assert 'asynq_queue_size{queue="critical"} 1.0' in metrics.text


async def test_workflows_list_on_a_cluster(cluster: RedisClusterProcs) -> None:
    from asyncq import chain

    async with Client(cluster.url) as client:
        for i in range(3):
            await chain(Task("a", queue="wfa"), Task("b", queue="wfa")).enqueue(
                client, workflow_id=f"c{i}"
            )
        await chain(Task("a", queue="wfb")).enqueue(client, workflow_id="d0")
    async with Inspector(cluster.url) as insp:
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = await insp.workflows(limit=2, cursor=cursor)
            assert len(page.workflows) <= 2
            seen += [w.id for w in page.workflows]
            if (cursor := page.cursor) is None:
                break
    assert sorted(seen) == ["c0", "c1", "c2", "d0"]
