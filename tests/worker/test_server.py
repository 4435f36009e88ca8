"""Server lifecycle, configuration, instant pickup and the periodic roles."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncq import Intervals, Limits
from asyncq import _keys as keys
from asyncq._producer.client import Client
from asyncq._worker.server import Server
from asyncq.errors import ServerClosedError
from asyncq.mux import ServeMux
from asyncq.proto.asynq import ServerInfo, TaskMessage, WorkerInfo
from asyncq.task import Task
from tests.support import transitions
from tests.support.procs import FAST, fast, stored_message, task_hash, wait_until, zset_ids
from tests.support.redis_server import free_port

Q = "default"


def mux_for(task_type: str, fn: Any) -> ServeMux:
    mux = ServeMux()
    mux.handle(task_type, fn)
    return mux


async def noop(task: Task) -> None:
    return None


# -- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"concurrency": 0}, ValueError, "concurrency must be at least 1"),
        ({"concurrency": 1.5}, TypeError, "concurrency must be an int"),
        ({"queues": {}}, ValueError, "queues cannot be empty"),
        ({"queues": {"  ": 1}}, ValueError, "non-blank"),
        ({"queues": {"a": 0}}, ValueError, "priority >= 1"),
        ({"shutdown_timeout": 8}, TypeError, "shutdown_timeout must be a datetime.timedelta"),
        ({"task_check_interval": timedelta(0)}, ValueError, "must be positive"),
        ({"group_grace_period": timedelta(milliseconds=500)}, ValueError, "at least 0:00:01"),
        ({"group_max_size": -1}, ValueError, "group_max_size must be at least 1"),
        ({"retry_delay": 3}, TypeError, "retry_delay must be callable"),
        (
            {"lease_duration": timedelta(seconds=5), "heartbeat_interval": timedelta(seconds=5)},
            ValueError,
            "must be longer than heartbeat_interval",
        ),
        ({"recoverer_cutoff": timedelta(seconds=-1)}, ValueError, "cannot be negative"),
    ],
)
def test_bad_options_are_rejected(
    redis_url: str, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Server(redis_url, **options)


def test_defaults_are_asynqs(redis_url: str) -> None:
    cfg = Server(redis_url).config
    assert cfg.concurrency == (os.cpu_count() or 1)
    assert dict(cfg.queues) == {"default": 1}
    assert cfg.shutdown_timeout == 8
    assert cfg.task_check_interval == 0.08  # asynq: 1 s; polling all queues is one call here
    assert cfg.delayed_task_check_interval == 5
    assert cfg.health_check_interval == 15
    assert (cfg.janitor_interval, cfg.janitor_batch_size) == (8, 100)
    assert (cfg.heartbeat_interval, cfg.lease_duration) == (5, 30)
    # asynq: 30 s; here the recoverer also checks at the earliest lease expiry (prompt recovery)
    assert (cfg.recoverer_interval, cfg.recoverer_cutoff) == (60, 2)
    assert (cfg.group_grace_period, cfg.group_check_interval) == (60, 7)
    assert (cfg.group_max_delay, cfg.group_max_size) == (0, 0)


async def test_start_errors(redis: Redis) -> None:
    server = Server(redis, **FAST)
    with pytest.raises(TypeError):
        await server.start(None)  # type: ignore[arg-type]
    await server.start(ServeMux())
    with pytest.raises(RuntimeError, match="already running"):
        await server.start(ServeMux())
    server.stop()
    assert server.state == "stopped"
    with pytest.raises(RuntimeError, match="stopped state"):
        await server.start(ServeMux())
    await server.shutdown()
    await server.shutdown()  # idempotent
    with pytest.raises(ServerClosedError):
        await server.start(ServeMux())


async def test_shutdown_of_a_new_server_is_a_no_op(redis: Redis) -> None:
    async with Server(redis) as server:
        pass
    assert server.state == "closed"
    assert await redis.ping()  # a shared client stays open


async def test_plain_function_as_handler(redis: Redis, client: Client) -> None:
    seen: list[str] = []

    def handle(task: Task) -> None:
        seen.append(task.type)

    async with Server(redis, **FAST) as server:
        await server.start(handle)
        await client.enqueue(Task("anything"))
        await wait_until(lambda: seen == ["anything"], what="task handled")


async def test_owned_connection_from_url(redis_url: str, redis: Redis) -> None:
    done = asyncio.Event()

    async def handle(task: Task) -> None:
        done.set()

    server = Server(redis_url, **FAST)
    await server.start(mux_for("u", handle))
    async with Client(redis) as client:
        await client.enqueue(Task("u"))
    await asyncio.wait_for(done.wait(), 10)
    await server.shutdown()
    assert server.connection.closed


# -- pickup ---------------------------------------------------------------------------------


async def test_idle_worker_is_delivered_the_enqueued_task_not_polling(
    redis: Redis, client: Client
) -> None:
    done = asyncio.Event()

    async def handle(task: Task) -> None:
        done.set()

    # With an hour-long check interval only direct delivery or a wake-up starts the task.
    server = Server(redis, concurrency=2, intervals=Intervals(task_check=timedelta(hours=1)))
    async with server:
        await server.start(mux_for("ping", handle))
        armed = keys.delivery_channel(server.server_id)

        async def settled() -> bool:
            # Armed, and the subscriber's wake-up (set before the processor may arm) counted
            # or absorbed: when it came during a fetch it ends the next idle wait, once.
            return await redis.get(armed) == b"1" and not server.processor._wakeup.is_set()

        await wait_until(settled, what="the processor to ask for delivery")
        wakeups = server.stats.wakeups
        await client.enqueue(Task("ping"))
        await asyncio.wait_for(done.wait(), 10)
        assert server.stats.delivered == 1
        assert server.stats.wakeups == wakeups
        assert server.stats.idle_timeouts == 0


async def test_idle_worker_is_woken_by_enqueue_where_no_delivery_is_made(
    redis: Redis, client: Client
) -> None:
    done = asyncio.Event()

    async def handle(task: Task) -> None:
        done.set()

    # A queue limited on this server is never delivered to: the enqueue's wake-up
    # message ends the idle wait, and the fetch applies the limit.
    server = Server(
        redis,
        concurrency=2,
        intervals=Intervals(task_check=timedelta(hours=1)),
        limits=Limits(local_queue_concurrency={"default": 1}),
    )
    async with server:
        await server.start(mux_for("ping", handle))
        await wait_until(lambda: server.stats.empty_fetches >= 1, what="processor idle")
        await client.enqueue(Task("ping"))
        await asyncio.wait_for(done.wait(), 10)
        assert server.stats.wakeups >= 1
        assert server.stats.wakeup_messages >= 1
        assert server.stats.idle_timeouts == 0
        assert server.stats.delivered == 0


async def test_task_without_wakeup_is_polled_within_task_check_interval(
    redis: Redis,
) -> None:
    """A task written as Go asynq writes it (no wake-up message) is still picked up."""
    done = asyncio.Event()

    async def handle(task: Task) -> None:
        done.set()

    server = Server(redis, intervals=Intervals(task_check=timedelta(milliseconds=200)))
    async with server:
        await server.start(mux_for("go", handle))
        armed = keys.delivery_channel(server.server_id)
        await wait_until(lambda: redis.get(armed), what="the processor to ask for delivery")
        # Armed: the subscriber's one wake-up is set. It ends at most the idle wait after the
        # fetch in flight; the fetch after the next empty one follows an idle timeout.
        fetches = server.stats.empty_fetches
        await wait_until(lambda: server.stats.empty_fetches >= fetches + 2, what="two polls")
        msg = TaskMessage(type="go", id="go-task", queue=Q, retry=25, timeout=1800)
        await redis.hset(
            keys.task_key(Q, "go-task"),
            mapping={"msg": bytes(msg), "state": "pending", "pending_since": time.time_ns()},
        )
        await redis.lpush(keys.pending_key(Q), "go-task")  # no PUBLISH, like Go asynq
        await asyncio.wait_for(done.wait(), 10)
        assert server.stats.idle_timeouts >= 1


# -- heartbeat -----------------------------------------------------------------------------


async def test_heartbeat_writes_server_and_worker_info_and_extends_leases(
    redis: Redis, client: Client
) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def handle(task: Task) -> None:
        started.set()
        await release.wait()

    server = Server(
        redis,
        concurrency=3,
        queues={"critical": 6, "low": 2},
        intervals=Intervals(heartbeat=timedelta(milliseconds=200)),
    )
    async with server:
        await server.start(mux_for("hb", handle))
        info = await client.enqueue(Task("hb", b"payload"), queue="critical")
        await started.wait()
        skey = keys.server_info_key(server.host, server.pid, server.server_id)
        wkey = keys.workers_key(server.host, server.pid, server.server_id)

        async def worker_listed() -> bool:
            return bool(await redis.hget(wkey, info.id))

        await wait_until(worker_listed, what="worker info")
        raw = await redis.get(skey)
        assert raw is not None
        si = ServerInfo.parse(raw)
        assert (si.host, si.pid, si.server_id) == (server.host, server.pid, server.server_id)
        assert si.concurrency == 3
        assert si.queues == {"critical": 6, "low": 2}  # as configured, not normalised
        assert si.status == "active"
        assert si.active_worker_count == 1
        assert 0 < await redis.ttl(skey) <= 2
        wi = WorkerInfo.parse(await redis.hget(wkey, info.id))
        assert (wi.task_id, wi.task_type, wi.task_payload, wi.queue) == (
            info.id,
            "hb",
            b"payload",
            "critical",
        )
        assert wi.deadline is not None and wi.start_time is not None
        assert wi.deadline > wi.start_time
        assert await redis.zscore(keys.ALL_SERVERS, skey) is not None

        first = await redis.zscore(keys.lease_key("critical"), info.id)
        assert first is not None

        async def lease_moved() -> bool:
            score = await redis.zscore(keys.lease_key("critical"), info.id)
            return score is not None and score > first

        await wait_until(lease_moved, within=5, what="lease extended")

        server.stop()

        async def reports_stopped() -> bool:
            data = await redis.get(skey)
            return data is not None and ServerInfo.parse(data).status == "stopped"

        await wait_until(reports_stopped, what="status stopped")
        release.set()
    assert not await redis.exists(skey)
    assert not await redis.exists(wkey)
    assert await redis.zscore(keys.ALL_SERVERS, skey) is None


# -- periodic roles ------------------------------------------------------------------------


async def test_forwarder_moves_scheduled_tasks(redis: Redis, client: Client) -> None:
    done = asyncio.Event()

    async def handle(task: Task) -> None:
        done.set()

    info = await client.enqueue(Task("later"), process_in=timedelta(seconds=1))
    assert await zset_ids(redis, keys.scheduled_key(Q)) == [info.id]
    server = Server(redis, **FAST)
    async with server:
        await server.start(mux_for("later", handle))
        await asyncio.wait_for(done.wait(), 10)
    assert server.stats.forwarded >= 1


async def test_recoverer_retries_or_archives_tasks_with_expired_leases(
    redis: Redis, client: Client
) -> None:
    # Two orphaned active tasks, as left by a crashed worker; one has no retries left.
    a = await client.enqueue(Task("orphan"), task_id="a")
    b = await client.enqueue(Task("orphan"), task_id="b", max_retry=0)
    got = await transitions.dequeue_many(client.broker, [Q], 2)
    assert {d.message.id for d in got} == {a.id, b.id}
    stale = int(time.time()) - 100
    await redis.zadd(keys.lease_key(Q), {"a": stale, "b": stale})
    server = Server(redis, **{**FAST, "retry_delay": lambda n, e, t: timedelta(hours=1)})
    async with server:
        await server.start(ServeMux())

        async def recovered() -> bool:
            ha = await task_hash(redis, Q, "a")
            hb = await task_hash(redis, Q, "b")
            return ha.get(b"state") == b"retry" and hb.get(b"state") == b"archived"

        await wait_until(recovered, what="recovered")
    for tid in ("a", "b"):
        assert (await stored_message(redis, Q, tid)).error_msg == "asynq: task lease expired"
    assert (await stored_message(redis, Q, "a")).retried == 1
    assert server.stats.recovered == 2


async def test_recoverer_leaves_live_leases_alone(redis: Redis, client: Client) -> None:
    await client.enqueue(Task("busy"), task_id="live")
    assert await transitions.dequeue_many(client.broker, [Q], 1)
    server = Server(redis, **fast(recoverer_cutoff=timedelta(0)))
    async with server:
        await server.start(ServeMux())
        await wait_until(lambda: server.stats.idle_timeouts >= 3, what="a few rounds")
    assert (await task_hash(redis, Q, "live"))[b"state"] == b"active"


async def test_janitor_deletes_expired_completed_tasks(redis: Redis, client: Client) -> None:
    server = Server(redis, **FAST, limits=Limits(janitor_batch_size=2))
    async with server:
        await server.start(mux_for("keep", noop))
        infos = [
            await client.enqueue(Task("keep"), retention=timedelta(seconds=1)) for _ in range(5)
        ]

        async def all_gone() -> bool:
            return not any([await redis.exists(keys.task_key(Q, i.id)) for i in infos])

        await wait_until(all_gone, what="completed tasks deleted")
    assert await redis.zcard(keys.completed_key(Q)) == 0
    assert server.stats.janitor_deleted == 5


async def test_health_check_reports_ok_and_failure(redis: Redis, redis_url: str) -> None:
    ok: list[BaseException | None] = []
    bad: list[BaseException | None] = []

    async def record_bad(exc: BaseException | None) -> None:
        bad.append(exc)

    quick = fast(health_check=timedelta(milliseconds=100))
    good = Server(redis, health_check=ok.append, **quick)
    broken = Server(f"redis://127.0.0.1:{free_port()}/0", health_check=record_bad, **quick)
    async with good, broken:
        await good.start(ServeMux())
        await broken.start(ServeMux())
        await wait_until(lambda: ok and bad, what="health checks")
    assert ok[0] is None
    assert isinstance(bad[0], Exception)


async def test_burst_mode_exits_when_queues_are_empty(redis: Redis, client: Client) -> None:
    seen: list[str] = []

    async def handle(task: Task) -> None:
        await asyncio.sleep(0.01)
        seen.append(task.id or "")

    await client.enqueue_many([Task("b") for _ in range(10)])
    server = Server(redis, concurrency=3, burst=True, **FAST)
    await asyncio.wait_for(server.run(mux_for("b", handle)), 20)
    assert len(seen) == 10
    assert server.state == "closed"
    assert await redis.llen(keys.pending_key(Q)) == 0


async def test_stop_keeps_running_tasks_and_fetches_nothing_new(
    redis: Redis, client: Client
) -> None:
    release = asyncio.Event()
    started: list[str] = []

    async def handle(task: Task) -> None:
        started.append(task.id or "")
        await release.wait()

    server = Server(redis, concurrency=2, **FAST)
    async with server:
        await server.start(mux_for("s", handle))
        first = await client.enqueue(Task("s"))
        await wait_until(lambda: started, what="first task started")
        server.stop()  # at once: no fetch starts after it returns
        second = await client.enqueue(Task("s"))
        release.set()

        async def first_done() -> bool:
            return not await redis.exists(keys.task_key(Q, first.id))

        await wait_until(first_done, what="running task finished")
    assert started == [first.id]
    assert (await task_hash(redis, Q, second.id))[b"state"] == b"pending"


def test_server_repr(redis_url: str) -> None:
    server = Server(redis_url, queues={"a": 1})
    assert "state=new" in repr(server) and "'a': 1" in repr(server)


async def test_start_with_redis_unreachable_says_so_once_and_serves_when_it_comes_up() -> None:
    """A programmatic worker whose Redis is down at start says once, clearly, that it
    cannot reach it, keeps retrying, and serves once Redis is up."""
    import structlog

    from tests.support.redis_server import RedisServer

    port = free_port()
    uri = f"redis://127.0.0.1:{port}/0"
    seen: list[str] = []

    async def handle(task: Task) -> None:
        seen.append(task.type)

    def unreachable(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in logs if str(e["event"]).startswith("cannot reach Redis")]

    with structlog.testing.capture_logs() as logs:
        async with Server(uri, **FAST) as server:
            await server.start(mux_for("late", handle))
            assert [(e["event"], e["log_level"]) for e in unreachable(logs)] == [
                (f"cannot reach Redis at {uri}; retrying until it answers", "error")
            ]
            redis_server = RedisServer(port=port)
            try:
                redis_server.start()
                async with Client(uri) as client:
                    await client.enqueue(Task("late"))
                await wait_until(lambda: seen == ["late"], what="served after Redis came up")
            finally:
                await server.shutdown()
                redis_server.cleanup()
    assert len(unreachable(logs)) == 1


async def test_start_with_redis_unreachable_names_it_without_the_password() -> None:
    import structlog

    port = free_port()
    with structlog.testing.capture_logs() as logs:
        async with Server(f"redis://app:s3cret@127.0.0.1:{port}/2", **FAST) as server:
            await server.start(ServeMux())
            await server.shutdown()
    events = [str(e["event"]) for e in logs if str(e["event"]).startswith("cannot reach")]
    assert events == [
        f"cannot reach Redis at redis://app:***@127.0.0.1:{port}/2; retrying until it answers"
    ]
    assert "s3cret" not in repr(logs)


async def test_run_prints_the_signal_hints_once_and_not_in_burst_mode(redis: Redis) -> None:
    import structlog

    def hints(logs: list[dict[str, Any]]) -> list[str]:
        return [str(e["event"]) for e in logs if str(e["event"]).startswith("send signal")]

    with structlog.testing.capture_logs() as logs:
        server = Server(redis, burst=True, **FAST)
        await asyncio.wait_for(server.run(ServeMux()), 20)
    assert server.state == "closed" and hints(logs) == []

    with structlog.testing.capture_logs() as logs:
        server = Server(redis, **FAST)
        running = asyncio.create_task(server.run(ServeMux()))
        await wait_until(lambda: hints(logs), what="the hints")
        server.stop()
        await server.shutdown()
        await asyncio.wait_for(running, 20)
    assert hints(logs) == [
        "send signal TSTP to stop processing new tasks",
        "send signal TERM or INT to terminate the process",
    ]
