"""A running Server through a Sentinel failover (SIGKILL of the master) and through a
restart of a Redis with ``appendonly yes``, while its handlers run.

Every write made before the outage is on the surviving data (replicated with WAIT, or
fsynced to the AOF), so the state afterwards is exact: each task ran once, the counters
say so, and nothing is left active, leased or pending.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from asyncq import Client, ServeMux, Server, Task
from tests.support.cluster import SentinelSetup
from tests.support.procs import FAST, wait_until
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("failover")]

Q = "default"
N = 12
CONCURRENCY = 4


def p(queue: str) -> str:
    return f"asynq:{{{queue}}}:"


class Handlers:
    """The first CONCURRENCY tasks block until ``release``; every run is recorded."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.runs: list[str] = []
        self.mux = ServeMux()
        self.mux.handle("work", self.work)

    async def work(self, task: Task) -> None:
        assert task.id is not None
        self.runs.append(task.id)
        await self.release.wait()


async def enqueue_all(url: str) -> list[str]:
    async with Client(url) as client:
        infos = await client.enqueue_many([Task("work", b"%d" % i) for i in range(N)])
    ids = [info.id for info in infos]  # type: ignore[union-attr]
    assert len(set(ids)) == N
    return ids


async def assert_running_state(r: Redis, running: set[str]) -> None:
    """What a Server holding *running* leaves in Redis mid-flight."""
    assert set(m.decode() for m in await r.lrange(p(Q) + "active", 0, -1)) == running
    leased = {m.decode(): s for m, s in await r.zrange(p(Q) + "lease", 0, -1, withscores=True)}
    assert set(leased) == running
    now = datetime.now(UTC).timestamp()
    assert all(now - 5 < score < now + 60 for score in leased.values())
    for task_id in running:
        h = await r.hgetall(p(Q) + "t:" + task_id)
        assert h[b"state"] == b"active" and b"pending_since" not in h
    assert await r.llen(p(Q) + "pending") == N - len(running)


async def assert_all_done_once(r: Redis, h: Handlers, ids: list[str]) -> None:
    assert sorted(h.runs) == sorted(ids), "every task ran exactly once"
    for kind in ("pending", "active"):
        assert await r.llen(p(Q) + kind) == 0, kind
    for kind in ("lease", "retry", "scheduled", "archived"):
        assert await r.zcard(p(Q) + kind) == 0, kind
    assert await r.keys(p(Q) + "t:*") == []
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    assert await r.get(p(Q) + "processed") == str(N).encode()
    assert await r.get(p(Q) + f"processed:{today}") == str(N).encode()
    assert not await r.exists(p(Q) + "failed", p(Q) + f"failed:{today}")


async def run_through_outage(
    url: str, data: Redis, outage: Callable[[], Awaitable[Redis]]
) -> tuple[Handlers, list[str], Redis]:
    """Start a Server, wait for the blocked handlers, cause *outage* (which returns a client
    on the surviving data), check the running state there, release and drain."""
    ids = await enqueue_all(url)
    h = Handlers()
    server = Server(url, concurrency=CONCURRENCY, **FAST)
    await server.start(h.mux)
    try:
        await wait_until(lambda: len(h.runs) == CONCURRENCY, within=20, what="handlers running")
        running = set(h.runs)
        await assert_running_state(data, running)
        survivor = await outage()
        # The outage lost nothing the server had written: the same running state.
        await assert_running_state(survivor, running)
        h.release.set()
        await wait_until(lambda: len(h.runs) >= N, within=60, what="the rest processed")

        async def drained() -> bool:
            return not await survivor.llen(p(Q) + "active") and not await survivor.zcard(
                p(Q) + "lease"
            )

        await wait_until(drained, within=30, what="the last completions written")
    finally:
        h.release.set()
        await server.shutdown()
    return h, ids, survivor


# -- Sentinel failover --------------------------------------------------------------------------


@pytest.fixture
def sentinel() -> Iterator[SentinelSetup]:
    setup = SentinelSetup().start()
    try:
        yield setup
    finally:
        setup.cleanup()


async def test_server_processes_through_a_sentinel_failover(sentinel: SentinelSetup) -> None:
    master = Redis(port=sentinel.master.port)
    promoted = Redis(port=sentinel.replica.port)

    async def kill_master() -> Redis:
        # Everything written so far is on the replica before the master dies.
        await master.set("asyncq-test:marker", 1)
        assert await master.execute_command("WAIT", 1, 5000) == 1
        assert sentinel.master.proc is not None
        sentinel.master.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(sentinel.master.proc.wait, 10)
        await wait_until(
            lambda: sentinel.master_port() == sentinel.replica.port,
            within=30,
            interval=0.1,
            what="the sentinel promoting the replica",
        )
        await wait_until(lambda: _is_master(promoted), within=10, what="the replica taking writes")
        return promoted

    try:
        h, ids, survivor = await run_through_outage(sentinel.url, master, kill_master)
        await assert_all_done_once(survivor, h, ids)
    finally:
        await master.aclose(close_connection_pool=True)
        await promoted.aclose()


async def _is_master(r: Redis) -> bool:
    info = await r.info("replication")
    return info.get("role") == "master"


# -- Redis restart with an append-only file -------------------------------------------------


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    srv = RedisServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"])
    srv.start()
    try:
        yield srv
    finally:
        srv.cleanup()


@pytest.fixture
async def aof_redis(aof_server: RedisServer) -> AsyncIterator[Redis]:
    r = Redis.from_url(aof_server.url)
    try:
        yield r
    finally:
        await r.aclose()


async def test_server_processes_through_a_redis_restart_with_aof(
    aof_server: RedisServer, aof_redis: Redis
) -> None:
    async def kill_and_restart() -> Redis:
        assert aof_server.proc is not None
        aof_server.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(aof_server.proc.wait, 10)
        aof_server.proc = None
        await asyncio.to_thread(aof_server.start)  # same port, same dir: the AOF is replayed
        await aof_redis.connection_pool.disconnect()  # the test's own client reconnects
        return aof_redis

    h, ids, survivor = await run_through_outage(aof_server.url, aof_redis, kill_and_restart)
    await assert_all_done_once(survivor, h, ids)
