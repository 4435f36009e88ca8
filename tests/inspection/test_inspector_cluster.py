"""Inspector and CLI on a three-master Redis Cluster started by the fixture."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from asyncq._inspection.inspector import Inspector
from asyncq._producer.client import Client
from asyncq.cli import main
from asyncq.task import Task, TaskState
from tests.support.cluster import RedisClusterProcs

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("inspector-cluster")]

# Slots 8090, 15214 and 5275: one queue on each master (asserted against the slot map below).
QUEUES = ("critical", "low", "video")


@pytest.fixture
async def insp(cluster: RedisClusterProcs) -> AsyncIterator[Inspector]:
    async with Inspector(cluster.url) as inspector:
        await inspector.redis.flushall(target_nodes=RedisCluster.PRIMARIES)
        yield inspector


async def test_inspector_on_a_cluster(cluster: RedisClusterProcs, insp: Inspector) -> None:
    owners = {cluster.master_port_of(f"asynq:{{{q}}}:pending") for q in QUEUES}
    assert owners == cluster.master_ports() and len(owners) == 3
    ids: dict[str, list[str]] = {}
    async with Client(cluster.url) as client:
        for q in QUEUES:
            ids[q] = [(await client.enqueue(Task("t", b"%d" % i), queue=q)).id for i in range(3)]
            await client.enqueue(Task("later", b""), queue=q, process_in=timedelta(hours=1))
            await client.enqueue(Task("g", b""), queue=q, group="grp")
    assert await insp.queues() == sorted(QUEUES)
    for q in QUEUES:
        info = await insp.queue_info(q)
        assert (info.pending, info.scheduled, info.aggregating, info.groups) == (3, 1, 1, 1)
        assert info.memory_usage > 0
        assert [t.id for t in await insp.list_pending(q)] == ids[q]
        await insp.archive_task(q, ids[q][0])
        assert await insp.run_all(q, "archived") == 1
        assert (await insp.get_task(q, ids[q][0])).state is TaskState.PENDING
        assert await insp.archive_all(q, "scheduled") == 1
        await insp.delete_task(q, ids[q][1])
        assert await insp.delete_all(q, "aggregating", group="grp") == 1
        assert len(await insp.history(q, 2)) == 2
        await insp.pause(q)
        await insp.resume(q)

        slot = await insp.cluster_key_slot(q)
        assert slot == key_slot(f"asynq:{{{q}}}:pending".encode())
        (node,) = await insp.cluster_nodes(q)
        owner = insp.redis.get_node_from_key(f"asynq:{{{q}}}:pending")
        assert node.addr == f"{owner.host}:{owner.port}"
    await insp.cancel("some-task")
    assert await insp.servers() == [] and await insp.scheduler_entries() == []
    await insp.delete_queue("critical", force=True)
    assert "critical" not in await insp.queues()


def test_cli_on_a_cluster(cluster: RedisClusterProcs, tmp_path: Path) -> None:
    env = {"COLUMNS": "80", "ASYNCQ_REDIS_URL": cluster.url, "HOME": str(tmp_path)}
    runner = CliRunner(env=env)
    result = runner.invoke(main, ["task", "enqueue", "-t", "x", "-q", "default", "--json"])
    assert result.exit_code == 0, result.output
    listed = runner.invoke(main, ["queue", "ls", "--cluster", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {r["queue"]: r for r in json.loads(listed.stdout)}
    assert rows["default"]["key_slot"] == key_slot(b"asynq:{default}:pending")
    assert len(rows["default"]["nodes"]) == 1
    stats = runner.invoke(main, ["stats"])
    assert stats.exit_code == 0 and "Redis Info" in stats.stdout
