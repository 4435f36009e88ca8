"""Workflows on a Redis Cluster: steps in the first step's hash slot run and hand off."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from redis.crc import key_slot

from asyncq import Client, Inspector, ServeMux, Server, Task, chain, chord, group_results
from tests.support.cluster import RedisClusterProcs
from tests.support.procs import FAST, wait_until

pytestmark = pytest.mark.cluster


def other_slot(q: str) -> str:
    """A queue name whose keys live in another hash slot than *q*'s."""
    return next(
        name
        for name in (f"{q}-{i}" for i in range(100))
        if key_slot(f"{{{name}}}".encode()) != key_slot(f"{{{q}}}".encode())
    )


async def test_workflow_smoke_on_a_cluster(cluster: RedisClusterProcs) -> None:
    q = f"wf-{uuid.uuid4().hex[:8]}"
    seen: list[bytes] = []
    mux = ServeMux()

    async def step(task: Task) -> None:
        assert task.result_writer is not None
        await task.result_writer.write((task.payload or b"") + b"+")

    async def callback(task: Task) -> None:
        payload = task.payload or b""
        seen.append(b"|".join(group_results(payload)) if payload[:1] == b"R" else payload)  # type: ignore[arg-type]

    mux.handle("step", step)
    mux.handle("callback", callback)
    async with Client(cluster.url) as client:
        a = await chain(
            Task("step", b"x", queue=q),
            Task("step", queue=q),
            Task("callback", queue=q, retention=timedelta(minutes=1)),
            pass_results=True,
        ).enqueue(client)
        b = await chord(
            [Task("step", str(i).encode(), queue=q) for i in range(5)],
            Task("callback", queue=q, retention=timedelta(minutes=1)),
        ).enqueue(client)
        # a queue of another hash slot cannot take part in the same atomic hand-off
        with pytest.raises(ValueError, match="hash slot"):
            await chain(Task("step", queue=q), Task("step", queue=other_slot(q))).enqueue(client)
        server = Server(cluster.url, queues={q: 1}, **FAST)
        await server.start(mux)
        try:
            await wait_until(lambda: len(seen) == 2, within=30, what="both callbacks")
        finally:
            await server.shutdown()
        async with Inspector(cluster.url) as insp:
            for info in (a, b):
                assert (await insp.get_workflow(q, info.id)).state == "succeeded"
    assert sorted(seen) == sorted([b"x++", b"0+|1+|2+|3+|4+"])
