"""Dynamic queues: a server serving queue patterns (``queues={"tenant:*": 1}``)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from redis.asyncio import Redis

from asyncq import Client, Inspector, Limits, ServeMux, Server, Task
from asyncq import _keys as keys
from asyncq._worker.limits import QueueLimits
from asyncq._worker.processor import QueueOrder
from asyncq._worker.queueset import QueueSet, resolve
from tests.support.gofixtures import GoTask
from tests.support.procs import fast, wait_until

ROOT = Path(__file__).resolve().parents[2]
REFRESH = fast(queue_refresh=timedelta(milliseconds=100))
"""FAST, re-reading the queue patterns often."""


def _recorder() -> tuple[ServeMux, list[tuple[str, bytes]]]:
    seen: list[tuple[str, bytes]] = []
    mux = ServeMux()

    @mux.handler("rec")
    async def rec(task: Task) -> None:
        seen.append((task.queue or "", task.payload))

    return mux, seen


async def _subscribed(redis: Redis, queue: str) -> bool:
    channel = keys.wakeup_channel(queue).encode()
    return channel in await redis.pubsub_channels()


# -- the queue set, pure -----------------------------------------------------------------------


def test_patterns_match_known_queues_explicit_names_win_and_weights_split() -> None:
    qs = QueueSet({"tenant:*": 4, "tenant:vip": 10, "critical": 5})
    assert qs.dynamic
    assert sorted(qs.names()) == ["critical", "tenant:vip"]  # explicit: always served
    plan = qs.plan({"tenant:a", "tenant:b", "tenant:vip", "other", "tenant:{x}"})
    assert plan.added == {"tenant:a", "tenant:b"} and not plan.removed
    qs.apply(plan)
    assert qs.priorities == {"critical": 5, "tenant:vip": 10, "tenant:a": 4, "tenant:b": 4}
    # The pattern's weight 4 is shared by its two matches; explicit names keep theirs.
    assert qs.weights == {"critical": 5, "tenant:vip": 10, "tenant:a": 2.0, "tenant:b": 2.0}
    version = qs.version
    plan = qs.plan({"tenant:b"})
    assert plan.removed == {"tenant:a"} and not plan.added
    qs.apply(plan)
    assert qs.version == version + 1 and qs.weights["tenant:b"] == 4
    qs.apply(qs.plan({"tenant:b"}))
    assert qs.version == version + 1  # nothing changed: no new version


def test_first_matching_pattern_wins_and_classes_work() -> None:
    qs = QueueSet({"a:[0-9]*": 2, "a:*": 1})
    qs.apply(qs.plan({"a:1x", "a:x", "b:1"}))
    assert qs.priorities == {"a:1x": 2, "a:x": 1}
    assert resolve({"a:*": 1, "a:b": 7}, "a:b") == 7
    assert resolve({"a:?": 3}, "a:bc") is None


def test_weighted_order_shares_a_patterns_weight_among_its_matches() -> None:
    import random

    weights = {"critical": 1.0, **{f"tenant:{i}": 1.0 / 100 for i in range(100)}}
    order = QueueOrder(dict.fromkeys(weights, 1), rng=random.Random(3), weights=weights)
    first = [order()[0] for _ in range(4000)]
    # critical and the 100 tenant queues together weigh the same: about half each.
    share = first.count("critical") / len(first)
    assert 0.45 < share < 0.55


def test_limits_apply_per_matching_queue() -> None:
    qs = QueueSet({"tenant:*": 1, "default": 1})
    limits = QueueLimits({"tenant:*": 1, "tenant:b": 3}, {}, None, qs)
    assert limits.for_fetch() == {"tenant:b": (3, -1)}
    qs.apply(qs.plan({"tenant:a", "tenant:b", "default"}))
    assert limits.for_fetch() == {"tenant:a": (1, -1), "tenant:b": (3, -1)}


@pytest.mark.parametrize(
    ("queues", "match"),
    [
        ({"tenant:[": 1}, r"bad queue pattern 'tenant:\[': '\[' is never closed"),
        ({"t[]": 1}, r"bad queue pattern 't\[\]'"),
        ({"t{x}*": 1}, "holds"),
        ({"tenant:*": 0}, "integer priority"),
    ],
)
def test_bad_patterns_are_refused_by_name(queues: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Server("redis://localhost:1", queues=queues)


def test_cli_refuses_bad_patterns() -> None:
    from click.testing import CliRunner

    from asyncq.cli import main

    runner = CliRunner()
    res = runner.invoke(main, ["-u", "redis://localhost:1", "worker", "x:mux", "-q", "t:[=1"])
    assert res.exit_code == 2
    assert "bad queue pattern 't:['" in res.output
    args = ["-u", "redis://localhost:1", "worker", "x:mux", "--queue-concurrency", "a[!]=1"]
    res = runner.invoke(main, args)
    assert res.exit_code == 2 and "bad queue pattern 'a[!]'" in res.output


def test_bad_patterns_in_flow_options_are_refused() -> None:
    with pytest.raises(ValueError, match=r"queue_concurrency: bad queue pattern 'x\['"):
        Server("redis://localhost:1", queue_concurrency={"x[": 1})
    with pytest.raises(ValueError, match=r"ordered_queues: bad queue pattern"):
        Server("redis://localhost:1", ordered_queues=["[a"])


# -- a running server ----------------------------------------------------------------------------


async def test_a_queue_created_after_start_is_served_and_shows_concretely(redis: Redis) -> None:
    mux, seen = _recorder()
    async with Client(redis) as client:
        await client.enqueue(Task("rec", b"early", queue="tenant:early"))
        server = Server(redis, queues={"tenant:*": 1, "critical": 5}, **REFRESH)
        async with server:
            await server.start(mux)
            await wait_until(lambda: ("tenant:early", b"early") in seen, what="early task")
            # Created after the server started: only the refresh can find it.
            await client.enqueue(Task("rec", b"late", queue="tenant:late"))
            await wait_until(lambda: ("tenant:late", b"late") in seen, what="late task")
            # Its wake-up channel is listened to from now on.
            await wait_until(
                lambda: _subscribed(redis, "tenant:late"), what="wake-up channel of the new queue"
            )
            await client.enqueue(Task("rec", b"no", queue="other"))
            assert sorted(server.served_queues) == ["critical", "tenant:early", "tenant:late"]

            async def listed() -> dict[str, int] | None:
                async with Inspector(redis) as insp:
                    servers = await insp.servers()
                if servers and "tenant:late" in servers[0].queues:
                    return dict(servers[0].queues)
                return None

            shown = await wait_until(listed, what="heartbeat with the late queue")
            # What asynqmon and the asynq CLI read: concrete names (map<string,int32>).
            assert shown == {"critical": 5, "tenant:early": 1, "tenant:late": 1}
    assert ("other", b"no") not in seen
    assert await redis.llen(keys.pending_key("other")) == 1


async def test_a_removed_queue_stops_being_served(redis: Redis) -> None:
    mux, seen = _recorder()
    async with Client(redis) as client, Inspector(redis) as insp:
        await client.enqueue(Task("rec", b"1", queue="tenant:gone"))
        server = Server(redis, queues={"tenant:*": 1}, **REFRESH)
        async with server:
            await server.start(mux)
            await wait_until(lambda: seen, what="first task")

            async def acked() -> bool:
                return await redis.llen(keys.active_key("tenant:gone")) == 0

            await wait_until(acked, what="task acked")
            await insp.delete_queue("tenant:gone")
            await wait_until(lambda: not server.served_queues, what="queue dropped")

            async def unsubscribed() -> bool:
                return not await _subscribed(redis, "tenant:gone")

            await wait_until(unsubscribed, what="wake-up channel dropped")
            # A task left behind in a queue removed from asynq:queues (as Go's
            # `asynq queue rm --force` can leave): nothing of this server touches it.
            # Written without registering the queue: an enqueue would list it again
            # (the server could serve it until the test unlisted it).
            left = GoTask("rec", b"2", queue="tenant:gone")
            await redis.hset(keys.task_key(left.queue, left.id), mapping={
                "msg": left.encode(), "state": "scheduled"})  # fmt: skip
            due = (await redis.time())[0]
            await redis.zadd(keys.scheduled_key(left.queue), {left.id: due})
            await asyncio.sleep(2.0)  # past due: a forwarder serving it would have moved it
            assert seen == [("tenant:gone", b"1")]
            assert not server.served_queues
            assert await redis.zscore(keys.scheduled_key("tenant:gone"), left.id) is not None


async def test_ordered_and_limit_patterns_apply_to_new_queues(redis: Redis) -> None:
    mux, seen = _recorder()
    server = Server(
        redis,
        queues={"tenant:*": 1},
        limits=Limits(ordered_queues=["tenant:*"], queue_concurrency={"tenant:*": 1}),
        **REFRESH,
    )
    async with server, Client(redis) as client:
        await server.start(mux)
        await client.enqueue_many(
            [Task("rec", str(i).encode(), queue="tenant:k1") for i in range(5)]
        )
        await wait_until(lambda: len(seen) == 5, what="ordered tasks")
        assert await redis.get(keys.ordered_key("tenant:k1")) == b"1"
        assert [p for _, p in seen] == [b"0", b"1", b"2", b"3", b"4"]


@pytest.mark.subprocess
def test_cli_worker_serves_a_pattern(redis_url: str, tmp_path: Path) -> None:
    import redis as sync_redis

    (tmp_path / "patapp.py").write_text(
        "import os\n"
        "from redis.asyncio import Redis\n"
        "from asyncq.mux import ServeMux\n"
        "mux = ServeMux()\n"
        "@mux.handler('echo')\n"
        "async def echo(task):\n"
        "    async with Redis.from_url(os.environ['TEST_REDIS_URL']) as r:\n"
        "        await r.rpush('handled', task.queue + '/' + task.payload.decode())\n"
    )
    r = sync_redis.Redis.from_url(redis_url)
    r.flushdb()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_REDIS_URL": redis_url}
    env.pop("ASYNCQ_REDIS_URL", None)
    cmd = [sys.executable, "-m", "asyncq.cli", "-u", redis_url, "worker", "patapp:mux"]
    cmd += ["-q", "tenant:*=1,critical=5", "--queue-concurrency", "tenant:*=1"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:

        async def run() -> None:
            async with Client(redis_url) as client:
                await wait_until(
                    lambda: r.zcard(keys.ALL_SERVERS) > 0 or proc.poll() is not None,
                    within=60,
                    what="worker heartbeat",
                )
                assert proc.poll() is None
                await client.enqueue(Task("echo", b"x", queue="tenant:cli"))
                await client.enqueue(Task("echo", b"y", queue="critical"))
            await wait_until(lambda: r.llen("handled") == 2, within=60, what="both tasks")

        asyncio.run(run())
        assert sorted(r.lrange("handled", 0, -1)) == [b"critical/y", b"tenant:cli/x"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        r.close()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
