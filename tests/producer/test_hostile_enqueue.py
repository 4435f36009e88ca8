"""Enqueue under hostile conditions (issue 25): a queue removed under a long-lived Client
(item 1) and a Redis that is out of memory (item 4)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError

from asyncq import Client, Inspector, ServeMux, Server, Step, Task, TaskState, chain
from asyncq._broker import Broker
from asyncq._broker.workflow import workflow_key
from asyncq._redis.scripts import _NO_FLAGS, Script
from asyncq.errors import RedisOutOfMemoryError
from asyncq.gateway import create_app as create_gateway
from tests.support import transitions
from tests.support.procs import FAST, wait_until
from tests.support.redis_server import RedisServer

Enqueue = Callable[[Client, str, int], Awaitable[Any]]


async def _single(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(Task("t", b"%d" % n), queue=q)


async def _hot(c: Client, q: str, n: int) -> Any:
    # The same option set twice: the second call takes the Client's template fast path.
    await c.enqueue(Task("t", b"warm%d" % n), queue=q)
    return await c.enqueue(Task("t", b"hot%d" % n), queue=q)


async def _unique(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(Task("t", b"u%d" % n), queue=q, unique=timedelta(hours=1))


async def _scheduled(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(Task("t", b"s%d" % n), queue=q, process_in=timedelta(hours=1))


async def _scheduled_unique(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(
        Task("t", b"su%d" % n), queue=q, process_in=timedelta(hours=1), unique=timedelta(hours=1)
    )


async def _group(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(Task("t", b"g%d" % n), queue=q, group="g")


async def _group_unique(c: Client, q: str, n: int) -> Any:
    return await c.enqueue(Task("t", b"gu%d" % n), queue=q, group="g", unique=timedelta(hours=1))


async def _many(c: Client, q: str, n: int) -> Any:
    out = await c.enqueue_many([Task("t", b"m%d-%d" % (n, i)) for i in range(3)], queue=q)
    assert not [o for o in out if isinstance(o, Exception)], out
    return out


async def _many_mixed(c: Client, q: str, n: int) -> Any:
    out = await c.enqueue_many(
        [
            (Task("t", b"x%d" % n), {"process_in": timedelta(hours=1)}),
            (Task("t", b"y%d" % n), {"task_id": f"y{n}"}),
        ],
        queue=q,
    )
    assert not [o for o in out if isinstance(o, Exception)], out
    return out


PATHS: dict[str, Enqueue] = {
    "single": _single,
    "hot": _hot,
    "unique": _unique,
    "scheduled": _scheduled,
    "scheduled_unique": _scheduled_unique,
    "group": _group,
    "group_unique": _group_unique,
    "many": _many,
    "many_mixed": _many_mixed,
}


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_an_enqueue_after_queue_removal_registers_the_queue_again(
    redis: Redis, path: str
) -> None:
    enqueue = PATHS[path]
    queue = f"tenant:{path}"
    async with Client(redis) as client:
        await enqueue(client, queue, 1)
        assert await redis.sismember("asynq:queues", queue)
        # `asyncq queue rm --force`, or FLUSHALL, behind the long-lived Client's back.
        async with Inspector(redis) as insp:
            await insp.delete_queue(queue, force=True)
        assert not await redis.sismember("asynq:queues", queue)
        await enqueue(client, queue, 2)
        assert await redis.sismember("asynq:queues", queue), path
        await redis.flushdb()
        await enqueue(client, queue, 3)
        assert await redis.sismember("asynq:queues", queue), path
        async with Inspector(redis) as insp:
            info = await insp.queue_info(queue)
            assert info.size >= 1


# Item 3: a workflow step finished by a Go worker (a plain acknowledgement) is resolved by
# cancel whatever it left behind: a completed task (retention) or an archived one.
@pytest.mark.parametrize("outcome", ["completed", "archived"])
async def test_cancel_resolves_a_step_a_go_worker_finished(redis: Redis, outcome: str) -> None:
    broker = Broker(redis)
    async with Client(redis) as client:
        first = Step(Task("a"), options={"retention": timedelta(hours=1)})
        last = Step(Task("b"), options={"retention": timedelta(minutes=5)})
        info = await chain(first, last).enqueue(client)
    got = await transitions.dequeue(broker, ["default"])
    assert got is not None
    if outcome == "completed":
        await broker.mark_as_complete(got.message)
    else:
        await broker.archive(got.message, "boom")
    async with Inspector(redis) as insp:
        assert await insp.cancel_workflow("default", info.id) == "running"
        seen = await insp.get_workflow("default", info.id)
        step = seen.stages[0][0]
        assert step.state == ("succeeded" if outcome == "completed" else "failed")
        # The task the Go worker left is kept (its result and retention are the user's).
        assert (await insp.get_task("default", step.id)).state.value == outcome
    ttl = await redis.ttl(workflow_key("default", info.id))
    assert 0 < ttl <= 300  # the workflow's own retention, not the 7-day hold of a live one


# Item 4: a full Redis (maxmemory, noeviction) is drained by its workers, and every enqueue
# path refuses with the one error type.
@pytest.fixture
async def full_redis() -> AsyncIterator[Redis]:
    srv = RedisServer(extra_args=["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"])
    srv.start()
    r = Redis.from_url(srv.url)
    try:
        yield r
    finally:
        await r.aclose()
        srv.stop()
        srv.cleanup()


async def _fill(redis: Redis, queue: str) -> int:
    written = 0
    async with Client(redis, retry=None) as client:
        while True:
            try:
                await client.enqueue(Task("fill", os.urandom(4000)), queue=queue)
            except RedisOutOfMemoryError:
                return written
            written += 1
            assert written < 10_000, "maxmemory never reached"


async def _overfull(redis: Redis) -> None:
    """Filled, then maxmemory set well below the memory in use: every write is refused
    whatever a connection's buffers free or take meanwhile."""
    assert await _fill(redis, "q") > 10
    await redis.config_set("maxmemory", "1mb")


async def test_a_full_redis_refuses_every_enqueue_path_with_one_error(full_redis: Redis) -> None:
    await _overfull(full_redis)
    async with Client(full_redis, retry=None) as client:
        for path, enqueue in sorted(PATHS.items()):
            with pytest.raises(RedisOutOfMemoryError, match="out of memory") as caught:
                if path.startswith("many"):
                    out = await client.enqueue_many([Task("t", b"x"), Task("t", b"y")], queue="q")
                    assert all(isinstance(o, RedisOutOfMemoryError) for o in out), out
                    raise out[0]  # type: ignore[misc]
                await enqueue(client, "fresh", 7)
            assert "maxmemory" in str(caught.value), path
    # A fresh client (its first enqueue to a queue registers it) says the same.
    async with Client(full_redis, retry=None) as client:
        with pytest.raises(RedisOutOfMemoryError):
            await client.enqueue(Task("t", b"z"), queue="another")


async def test_workers_drain_a_full_redis(full_redis: Redis) -> None:
    written = await _fill(full_redis, "q")
    done = 0
    mux = ServeMux()

    async def handle(task: Task) -> None:
        nonlocal done
        done += 1

    mux.handle("fill", handle)
    server = Server(full_redis, concurrency=4, queues={"q": 1}, **FAST)
    await server.start(mux)
    try:
        async with Inspector(full_redis) as insp:

            async def drained() -> bool:
                info = await insp.queue_info("q")
                return info.pending == 0 and info.active == 0

            await wait_until(drained, what="the full queue drained", within=60)
    finally:
        await server.shutdown()
    assert done >= written
    async with Client(full_redis, retry=None) as client:
        await client.enqueue(Task("t", b"room again"), queue="q")


class _NoFlagsRedis:
    """A Redis 6.2 as a script sees it: no shebang line, and EVALSHA of unknown scripts."""

    def __init__(self) -> None:
        self.scripts: dict[str, str] = {}

    async def script_load(self, source: str) -> str:
        if source.startswith("#!"):
            raise ResponseError(
                "Error compiling script (new function): user_script:1: unexpected symbol near '#'"
            )
        sha = hashlib.sha1(source.encode()).hexdigest()
        self.scripts[sha] = source
        return sha

    async def execute_command(self, *args: Any) -> Any:
        assert args == ("INFO", "server"), args  # the loader's version check
        return b"# Server\r\nredis_version:6.2.14\r\n"

    async def evalsha(self, sha: str, numkeys: int, *args: Any) -> Any:
        if sha not in self.scripts:
            raise NoScriptError("NOSCRIPT No matching script.")
        return sha


async def test_a_server_without_script_flags_runs_the_plain_script() -> None:
    script = Script("dequeue_queues", "return 1")
    assert script.flagged_source == "#!lua flags=allow-oom\nreturn 1"
    old = _NoFlagsRedis()
    for _ in range(3):
        assert await script(old, ("k",)) == script.sha  # type: ignore[arg-type]
    assert script.flagged_sha not in old.scripts
    plain = Script("forward", "return 1")
    assert plain.flagged_source is None


async def test_the_gateway_answers_a_full_redis_with_503(full_redis: Redis) -> None:
    await _overfull(full_redis)
    app = create_gateway(full_redis)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        r = await c.post("/api/queues/q/tasks", json={"type": "t", "payload": 1})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "redis_out_of_memory"
        batch = await c.post("/api/queues/q/tasks/batch", json={"tasks": [{"type": "t"}]})
        assert batch.status_code == 200, batch.text
        assert batch.json()["results"][0]["status"] == 503
        assert batch.json()["results"][0]["error"]["code"] == "redis_out_of_memory"
    await app.state.gateway.aclose()


async def test_without_script_flags_a_full_redis_still_acks_and_deletes(
    full_redis: Redis,
) -> None:
    """What Redis 6.2 does (plain scripts: the OOM check is on the first write that grows
    memory): an acknowledgement and a deletion run, a dequeue is refused."""
    broker = Broker(full_redis)
    _NO_FLAGS[full_redis] = True
    await _fill(full_redis, "q")
    await full_redis.config_set("maxmemory", "0")  # room for one dequeue
    got = await transitions.dequeue(broker, ["q"])
    assert got is not None
    await full_redis.config_set("maxmemory", "1mb")
    with pytest.raises(RedisOutOfMemoryError):
        await transitions.dequeue(broker, ["q"])
    await broker.done(got.message)
    async with Inspector(full_redis) as insp:
        pending = await insp.list_tasks("q", TaskState.PENDING, size=1)
        await insp.delete_task("q", pending[0].id)
        assert (await insp.queue_info("q")).active == 0


async def test_a_pattern_worker_serves_a_queue_recreated_under_a_long_lived_client(
    redis: Redis,
) -> None:
    """Item 1 end to end: `queue rm` of an idle queue, then the same Client enqueues to it
    again: a `tenant:*` worker must run that task (it only sees queues in asynq:queues)."""
    seen: list[bytes] = []
    mux = ServeMux()

    async def handle(task: Task) -> None:
        seen.append(task.payload or b"")

    mux.handle("t", handle)
    server = Server(redis, concurrency=2, queues={"tenant:*": 1}, **FAST)
    async with Client(redis) as client:
        await client.enqueue(Task("t", b"first"), queue="tenant:a")
        await server.start(mux)
        try:
            await wait_until(lambda: seen == [b"first"], what="the first task", within=60)
            assert server.served_queues == ["tenant:a"]
            async with Inspector(redis) as insp:
                await insp.delete_queue("tenant:a", force=True)
            # The worker drops the removed queue at its next refresh of asynq:queues.
            await wait_until(lambda: server.served_queues == [], what="the queue dropped")
            await client.enqueue(Task("t", b"second"), queue="tenant:a")
            await wait_until(lambda: b"second" in seen, what="the task after queue rm", within=60)
        finally:
            await server.shutdown()
