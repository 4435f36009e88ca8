"""Many queues: one script call per fetch, batched periodic work, idle cost, byte bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from asyncq import Client, Limits, Server, Task
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.multiqueue import _DELETE_EXPIRED_COMPLETED, _FORWARD, _PROBE_CHUNK, MultiQueue
from asyncq._worker.processor import QueueOrder
from asyncq.mux import ServeMux
from tests.support.cluster import RedisClusterProcs
from tests.support.helpers import FakeClock, make_msg, push_go_task, snapshot
from tests.support.procs import wait_until
from tests.support.redis_server import RedisServer
from tests.support.resp_proxy import CountingProxy

QUEUES = {f"mq{i:04d}": 1 + i for i in range(1000)}  # strict: mq0999 first


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """A Redis of this module's own, so command counts see no other test's traffic."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def own(own_server: RedisServer) -> AsyncIterator[Redis]:
    redis = Redis(port=own_server.port)
    await redis.flushall()
    await redis.config_resetstat()
    try:
        yield redis
    finally:
        await redis.aclose()


async def command_calls(redis: Redis) -> dict[str, int]:
    """Calls per command so far (INFO commandstats), INFO itself left out."""
    stats = await redis.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if name != "cmdstat_info"
    }


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


# What the multi-queue scripts run inside Redis (commandstats counts those too).
IN_SCRIPT = {
    "llen", "exists", "lindex", "hstrlen", "rpoplpush", "hget", "hset", "hdel", "zadd", "lrem",
    "zrangebyscore", "zrem", "lpush", "sadd", "publish", "del", "zrange", "zremrangebyscore",
    "lpop", "rpush", "type",
    "get", "zcount",  # flow control: the stored limit, the live leases
}  # fmt: skip


def script_calls(calls: dict[str, int]) -> dict[str, int]:
    """The delta without the commands scripts ran inside Redis."""
    return {k: n for k, n in calls.items() if k not in IN_SCRIPT}


async def test_a_strict_fetch_over_1000_queues_is_one_script_call(own: Redis) -> None:
    multi = MultiQueue(Broker(own))
    order = QueueOrder(QUEUES, strict=True)()
    assert order[0] == "mq0999"
    await multi.dequeue(order, 1)  # loads the script
    # Tasks only in low-priority queues: the fetch walks past 990 empty ones.
    for i in (3, 5, 9):
        for n in range(4):
            await push_go_task(own, f"mq{i:04d}", f"id-{i}-{n}")
    await own.execute_command("SADD", keys.ALL_QUEUES, *QUEUES)  # as the server would
    before = await command_calls(own)
    got = await multi.dequeue(order, 6, strict=True)
    calls = delta(await command_calls(own), before)
    assert script_calls(calls) == {"evalsha": 1}
    assert calls["llen"] < 1000  # the walk stopped once it had enough
    # Strict priority across the queues: all of mq0009 first, then mq0005.
    assert [t.message.queue for t in got.tasks] == ["mq0009"] * 4 + ["mq0005"] * 2
    # FIFO within a queue, asynq's transitions: active list, lease, state.
    assert [t.message.id for t in got.tasks[:4]] == [f"id-9-{n}" for n in range(4)]
    for t in got.tasks:
        q = t.message.queue
        assert await own.hget(keys.task_key(q, t.message.id), "state") == b"active"
        assert not await own.hexists(keys.task_key(q, t.message.id), "pending_since")
        assert await own.zscore(keys.lease_key(q), t.message.id) == int(t.lease_expiry)
    assert await own.lrange(keys.active_key("mq0005"), 0, -1) == [b"id-5-1", b"id-5-0"]
    assert {"mq0999", "mq0010", "mq0009"} <= got.empty
    assert "mq0005" not in got.empty and "mq0003" not in got.empty


async def test_a_weighted_fetch_is_one_call_and_skips_paused_queues(own: Redis) -> None:
    multi = MultiQueue(Broker(own))
    order = QueueOrder(QUEUES)
    await multi.dequeue(order(), 1)
    await push_go_task(own, "mq0100", "paused-task")
    await own.set(keys.paused_key("mq0100"), int(time.time()))
    await push_go_task(own, "mq0200", "ready-task")
    before = await command_calls(own)
    got = await multi.dequeue(order(), 5)
    assert script_calls(delta(await command_calls(own), before)) == {"evalsha": 1}
    assert [t.message.id for t in got.tasks] == ["ready-task"]
    assert "mq0100" in got.empty  # paused counts as empty
    assert await own.llen(keys.pending_key("mq0100")) == 1


async def test_forwarder_janitor_recoverer_passes_are_one_call_each(own: Redis) -> None:
    broker = Broker(own)
    multi = MultiQueue(broker)
    names = list(QUEUES)
    async with Client(own) as client:
        for q in names[:300]:
            await client.enqueue(Task("later"), queue=q, process_in=timedelta(seconds=1))
    await asyncio.sleep(1.2)
    await multi.forward(names[-1:])
    await multi.delete_expired_completed(names[:1])
    await multi.scan_leases(datetime.now(UTC), names[:1])
    await multi.reclaim_stale_aggregation_sets(names[:1])
    before = await command_calls(own)
    assert await multi.forward(names) == 300
    assert await multi.delete_expired_completed(names) == 0
    assert await multi.scan_leases(datetime.now(UTC), names) == ([], None)
    await multi.reclaim_stale_aggregation_sets(names)
    assert script_calls(delta(await command_calls(own), before)) == {"evalsha": 4}
    for q in names[:300]:
        assert await own.llen(keys.pending_key(q)) == 1


async def test_forward_moves_more_than_a_batch(own: Redis) -> None:
    multi = MultiQueue(Broker(own))
    async with Client(own) as client:
        for _ in range(250):
            await client.enqueue(Task("later"), queue="big", process_in=timedelta(seconds=1))
    await asyncio.sleep(1.2)
    assert await multi.forward(["big", "mq0001"]) == 250
    assert await own.llen(keys.pending_key("big")) == 250


async def test_idle_worker_on_1000_queues_sends_few_commands(
    own: Redis, own_server: RedisServer
) -> None:
    """An upper bound on a count of commands over a window, not a timing."""
    picked: list[str] = []
    mux = ServeMux()

    async def handle(task: Task) -> None:
        picked.append(task.id)

    mux.handle("t", handle)
    async with CountingProxy(own_server.port) as proxy:
        server = Server(f"redis://127.0.0.1:{proxy.port}", queues=QUEUES, concurrency=10)
        async with server:
            await server.start(mux)
            await wait_until(lambda: server.stats.empty_fetches >= 1, what="an idle worker")
            await asyncio.sleep(1.0)  # startup writes (queue registration) are over
            before = await command_calls(own)
            sent = proxy.commands
            start = time.monotonic()
            await asyncio.sleep(5.0)
            window = time.monotonic() - start
            sent = proxy.commands - sent
            every = delta(await command_calls(own), before)
            calls = script_calls(every)
            # Commands sent over the network, Redis' own count of the top-level ones, and
            # every command Redis ran, those inside scripts included: 50 a second in all.
            assert sent <= 50 * window, (sent, calls)
            assert sum(calls.values()) <= 50 * window, calls
            assert sum(every.values()) <= 50 * window, every
            assert server.stats.empty_fetches > 0
            # Still picks up a task that nobody announces (Go asynq, redis-cli): Redis
            # tells the worker its pending list was written (key tracking) ...
            await push_go_task(own, "mq0500", "go-task")
            await wait_until(lambda: "go-task" in picked, what="the unannounced task")
            assert server.stats.invalidations >= 1
            # ... and one enqueued by asyncq, delivered to the idle worker directly (its
            # registration in the 1000 waiters lists was written before the window).
            async with Client(own) as client:
                info = await client.enqueue(Task("t"), queue="mq0007")
            await wait_until(lambda: info.id in picked, what="the delivered task")
            assert server.stats.delivered == 1


async def test_strict_server_over_1000_queues_drains_in_priority_order(own: Redis) -> None:
    order: list[str] = []
    done = asyncio.Event()
    mux = ServeMux()

    async def handle(task: Task) -> None:
        order.append(task.payload.decode())
        if len(order) == 60:
            done.set()

    mux.handle("t", handle)
    for i in range(0, 1000, 50):  # 20 queues x 3 tasks, written before the worker starts
        for n in range(3):
            await push_go_task(own, f"mq{i:04d}", f"p-{i}-{n}", payload=f"{i:04d}".encode())
    server = Server(own, queues=QUEUES, strict_priority=True, concurrency=1)
    async with server:
        await server.start(mux)
        await asyncio.wait_for(done.wait(), 60)
    assert order == sorted(order, reverse=True)


async def test_in_flight_bytes_are_bounded_with_1mb_payloads(own: Redis) -> None:
    mb = 1024 * 1024
    running = 0
    peak_small = 0  # most bytes held while only 1 MB tasks ran
    big_ran_with = -1  # bytes already running when the 5 MB task started
    sizes: list[int] = []
    release = asyncio.Event()
    mux = ServeMux()

    async def handle(task: Task) -> None:
        nonlocal running, peak_small, big_ran_with
        size = len(task.payload)
        if size > mb:
            big_ran_with = running
        running += size
        if size == mb:
            peak_small = max(peak_small, running)
        sizes.append(size)
        await asyncio.sleep(0.05)
        await release.wait()
        running -= size

    mux.handle("t", handle)
    async with Client(own) as client:
        for _ in range(12):
            await client.enqueue(Task("t", b"x" * mb), queue="big")
        await client.enqueue(Task("t", b"y" * (5 * mb)), queue="big")
    # Room for three 1 MB messages (payload plus a few dozen bytes of envelope each).
    server = Server(
        own, queues={"big": 1}, concurrency=10, limits=Limits(max_inflight_bytes=3 * mb + 4096)
    )
    async with server:
        await server.start(mux)
        await wait_until(lambda: len(sizes) >= 3, what="the first tasks")
        await asyncio.sleep(0.3)
        assert len(sizes) == 3  # three 1 MB tasks fit, a fourth would not
        release.set()
        await wait_until(lambda: len(sizes) == 13, within=30, what="every task")
        await wait_until(lambda: running == 0, what="the last handler")
    assert peak_small <= 3 * mb  # never more than the bound, with 10 free slots
    assert sizes.count(5 * mb) == 1
    assert big_ran_with == 0  # the task larger than the bound ran alone


def test_max_inflight_bytes_is_validated() -> None:
    with pytest.raises(ValueError, match="max_inflight_bytes"):
        Server("redis://localhost:1", max_inflight_bytes=0)


@pytest.mark.cluster
async def test_cluster_fetch_keeps_strict_order_across_nodes(cluster: RedisClusterProcs) -> None:
    async with Client(cluster.url) as client:
        redis = client.redis
        broker = Broker(redis)
        multi = MultiQueue(broker)
        names = [f"cq{i}" for i in range(30)]
        await redis.initialize()
        nodes = {redis.get_node_from_key(keys.pending_key(q)).name for q in names}
        assert len(nodes) == 3  # the queues live on every node
        for q in names:
            await redis.delete(keys.pending_key(q), keys.scheduled_key(q))
        for i, q in enumerate(names):
            for n in range(2):
                await client.enqueue(Task("t", f"{i:02d}".encode()), queue=q, task_id=f"{q}-{n}")
        order = list(reversed(names))  # strict: cq29 first
        got = await multi.dequeue(order, 10, strict=True)
        assert [t.message.queue for t in got.tasks] == [q for q in order[:5] for _ in range(2)]
        got = await multi.dequeue(order, 100)
        assert len(got.tasks) == 50
        assert sorted(t.message.queue for t in got.tasks) == sorted(
            q for q in order[5:] for _ in range(2)
        )
        # Each task moved as asynq moves it, on its own node.
        t = got.tasks[0].message
        assert await redis.hget(keys.task_key(t.queue, t.id), "state") == b"active"
        # Forwarding over the cluster: one call per node, every queue served.
        for q in names:
            await client.enqueue(Task("later"), queue=q, process_in=timedelta(seconds=1))
        await asyncio.sleep(1.2)
        assert await multi.forward(names) == 30
        expired, _ = await multi.scan_leases(datetime.now(UTC) + timedelta(minutes=5), names)
        assert expired


async def test_passes_read_only_the_queues_named_not_their_other_arguments(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # The scripts' leading arguments (now, batch size, the probe chunk: 200 on one
    # server) come before the queue names; a queue named like one of them is not
    # part of a call that does not name it.
    other = str(_PROBE_CHUNK)
    await broker.schedule(make_msg("s1", other), clock.dt - timedelta(seconds=5))
    await broker.enqueue(make_msg("a1", other))
    assert len((await broker.fetch([other], 1)).tasks) == 1
    clock.now += broker.lease_duration + 10
    # one of its leases expired, one still running
    await broker.enqueue(make_msg("a2", other))
    assert len((await broker.fetch([other], 1)).tasks) == 1
    before = await snapshot(redis)

    assert await broker.forward_queues(["default"]) == 0
    assert await broker.scan_leases(clock.dt, ["default"]) == ([], None)
    assert await snapshot(redis) == before
    assert await redis.zrange(keys.scheduled_key(other), 0, -1) == [b"s1"]


async def test_lease_scan_skips_an_expired_id_without_a_task_hash(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    await broker.enqueue(make_msg("gone", "default"))
    await broker.enqueue(make_msg("kept", "default"))
    assert len((await broker.fetch(["default"], 2)).tasks) == 2
    await redis.delete(keys.task_key("default", "gone"))
    clock.now += broker.lease_duration + 10
    before = await snapshot(redis)

    expired, later = await broker.scan_leases(clock.dt, ["default"])

    assert [(q, m.id) for q, m in expired] == [("default", "kept")]
    assert later is None
    assert await snapshot(redis) == before


async def test_lease_scan_reports_the_earliest_lease_still_running(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # The earliest running lease is in the first queue of the call; a later queue has a
    # later one, the last none (only an expired lease).
    start = clock.now
    fetches = [("default", "a"), ("expired", "e"), ("default", "b"), ("default", "c")]
    fetches.append(("later", "d"))
    for i, (q, id_) in enumerate(fetches):
        clock.now = start + 5 * i
        await broker.enqueue(make_msg(id_, q))
        assert len((await broker.fetch([q], 1)).tasks) == 1
    clock.now = start + broker.lease_duration + 6
    b_expiry = await redis.zscore(keys.lease_key("default"), "b")
    c_expiry = await redis.zscore(keys.lease_key("default"), "c")
    d_expiry = await redis.zscore(keys.lease_key("later"), "d")
    assert b_expiry is not None and c_expiry is not None and d_expiry is not None
    assert clock.now < b_expiry < c_expiry < d_expiry

    expired, later = await broker.scan_leases(clock.dt, ["default", "later", "expired"])

    assert [(q, m.id) for q, m in expired] == [("default", "a"), ("expired", "e")]
    assert later == b_expiry


async def test_forward_reply_asks_again_only_when_a_set_had_a_full_batch(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # {moved, more, earliest}: more is 1 only when a scheduled or retry set still had
    # FORWARD_BATCH due ids (the forwarder calls again); otherwise one call is enough.
    # Nothing left scheduled: no earliest score.
    multi = MultiQueue(broker)
    for i in range(3):
        await broker.schedule(make_msg(f"s{i}", "default"), clock.dt - timedelta(seconds=5))
    args = (int(clock.now), int(clock.now * 1_000_000_000), 3, _PROBE_CHUNK)
    assert await multi._call(_FORWARD, None, ["default"], args) == [3, 1, b""]
    assert await multi._call(_FORWARD, None, ["default"], args) == [0, 0, b""]
    await broker.schedule(make_msg("s9", "default"), clock.dt - timedelta(seconds=5))
    assert await multi._call(_FORWARD, None, ["default"], args) == [1, 0, b""]
    assert await redis.llen(keys.pending_key("default")) == 4


async def test_forward_answers_the_earliest_score_left_after_its_moves(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # The forwarder sleeps until the earliest score left in any scheduled or retry set
    # of its queues: the smallest over both sets and every queue, read after the moves
    # (a due id moved is not "left"), None when every set is empty.
    now = int(clock.now)
    await broker.schedule(make_msg("due", "a"), clock.dt - timedelta(seconds=1))
    await broker.schedule(make_msg("a-later", "a"), clock.dt + timedelta(seconds=30))
    await broker.schedule(make_msg("b-sched", "b"), clock.dt + timedelta(seconds=9))
    await redis.zadd(keys.retry_key("b"), {"b-retry": now + 7})
    await redis.hset(keys.task_key("b", "b-retry"), mapping={"state": "retry"})
    await broker.schedule(make_msg("c-later", "c"), clock.dt + timedelta(seconds=8))
    assert await broker.forward_due(["a", "b", "c"]) == (1, float(now + 7))
    assert await broker.forward_due(["a", "c"]) == (0, float(now + 8))
    assert await broker.forward_due(["a"]) == (0, float(now + 30))
    assert await broker.forward_due(["empty"]) == (0, None)


async def test_forward_moves_a_due_grouped_task_to_its_group(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # A due task whose hash names a group (asynq's forward reads the "group" field)
    # goes to that group's set, aggregating; one with an empty group field to pending.
    due = clock.dt - timedelta(seconds=5)
    await broker.schedule(make_msg("grouped", "default", group_key="g1"), due)
    await broker.schedule(make_msg("plain", "default"), due)
    await redis.hset(keys.task_key("default", "grouped"), "group", "g1")
    await redis.hset(keys.task_key("default", "plain"), "group", "")

    assert await broker.forward_queues(["default"]) == 2

    assert await redis.zrange(keys.group_key("default", "g1"), 0, -1, withscores=True) == [
        (b"grouped", int(clock.now))
    ]
    assert await redis.smembers(keys.all_groups("default")) == {b"g1"}
    assert await redis.hget(keys.task_key("default", "grouped"), "state") == b"aggregating"
    assert await redis.lrange(keys.pending_key("default"), 0, -1) == [b"plain"]
    assert await redis.hget(keys.task_key("default", "plain"), "state") == b"pending"
    assert await redis.zcard(keys.scheduled_key("default")) == 0


@pytest.mark.parametrize("probe", [1, 2, 3])
async def test_periodic_passes_probing_a_few_queues_at_a_time_see_every_queue(
    redis: Redis, redis_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, probe: int
) -> None:
    # One EXISTS looks at `probe` queues' sets (1 on a cluster): however the queues are
    # cut into chunks, the janitor, the forwarder, the lease scan and the reclaim of
    # aggregation sets see each queue once.
    from asyncq._broker import multiqueue

    monkeypatch.setattr(multiqueue, "_PROBE_CHUNK", probe)
    names = ["e1", "a", "e2", "e3", "b", "e4"]
    busy = ["a", "b"]
    # A script looping over its chunks for ever fails the call in seconds, not at the
    # test's time limit.
    client = Redis.from_url(redis_url, socket_timeout=30)
    try:
        broker = Broker(client, clock=clock)
        for q in busy:
            await broker.enqueue(make_msg(f"{q}-old", q))
            await broker.enqueue(make_msg(f"{q}-done", q, retention=10))
            for task in (await broker.fetch([q], 2)).tasks:
                if task.message.id.endswith("-done"):
                    await broker.mark_as_complete(task.message)
        clock.now += broker.lease_duration + 60
        for q in busy:
            await broker.enqueue(make_msg(f"{q}-run", q))
            assert len((await broker.fetch([q], 1)).tasks) == 1
            await broker.schedule(make_msg(f"{q}-due", q), clock.dt - timedelta(seconds=5))
            set_key = keys.aggregation_set_key(q, "grp", "s1")
            await redis.zadd(set_key, {f"{q}-member": 5.0})
            await redis.zadd(keys.all_aggregation_sets(q), {set_key: clock.now - 100})

        assert await broker.delete_expired_completed_queues(names) == 2
        assert await broker.forward_queues(names) == 2
        expired, later = await broker.scan_leases(clock.dt, names)
        await broker.reclaim_stale_aggregation_sets_queues(names)

        for q in busy:
            assert not await redis.exists(keys.task_key(q, f"{q}-done"))
            assert await redis.zcard(keys.completed_key(q)) == 0
            assert await redis.lrange(keys.pending_key(q), 0, -1) == [f"{q}-due".encode()]
            assert await redis.zrange(keys.group_key(q, "grp"), 0, -1) == [f"{q}-member".encode()]
            assert not await redis.exists(keys.aggregation_set_key(q, "grp", "s1"))
        assert sorted((q, m.id) for q, m in expired) == [("a", "a-old"), ("b", "b-old")]
        assert later == await redis.zscore(keys.lease_key("a"), "a-run")
    finally:
        await client.aclose()


async def test_at_one_queue_per_probe_no_script_command_spans_two_slots(
    broker: Broker, redis: Redis, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a cluster a probe names one queue: even with allow-cross-slot-keys one command
    # inside a script cannot span slots. One server runs such a command anyway, so
    # the keys of every EXISTS the multi-queue scripts run are read from MONITOR.
    from redis.crc import key_slot

    from asyncq._broker import multiqueue

    monkeypatch.setattr(multiqueue, "_PROBE_CHUNK", 1)
    names = ["a", "b", "c"]
    for q in names:
        await broker.enqueue(make_msg(f"{q}-1", q))
        await broker.schedule(make_msg(f"{q}-2", q), clock.dt - timedelta(seconds=5))
    mark = "end of the passes"
    probes: list[list[str]] = []
    async with redis.monitor() as monitor:
        assert len((await broker.fetch(names, 10)).tasks) == 3
        assert await broker.forward_queues(names) == 3
        await broker.scan_leases(clock.dt, names)
        await broker.delete_expired_completed_queues(names)
        await broker.reclaim_stale_aggregation_sets_queues(names)
        await redis.echo(mark)
        while True:
            command = await monitor.next_command()
            words = command["command"].split(" ")
            if command["client_type"] == "lua" and words[0].upper() == "EXISTS":
                probes.append(words[1:])
            elif command["command"] == f"ECHO {mark}":
                break
    # each of the five scripts probes each queue on its own
    assert len(probes) >= 5 * len(names), probes
    for keys_ in probes:
        assert len({key_slot(k.encode()) for k in keys_}) == 1, keys_


async def _completed(broker: Broker, qname: str, *ids: str) -> None:
    """Tasks of *qname* completed now, kept 10 s."""
    for id_ in ids:
        await broker.enqueue(make_msg(id_, qname, retention=10))
    for task in (await broker.fetch([qname], len(ids))).tasks:
        await broker.mark_as_complete(task.message)


async def test_janitor_reply_asks_again_only_when_a_queue_had_a_full_batch(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # {deleted, more}: more is 1 only when a completed set gave a full batch (the
    # janitor calls again); otherwise one call is enough.
    multi = MultiQueue(broker)
    await _completed(broker, "default", "c0", "c1", "c2")
    clock.now += 60
    args = (int(clock.now), 3, _PROBE_CHUNK)
    assert await multi._call(_DELETE_EXPIRED_COMPLETED, None, ["default"], args) == [3, 1]
    assert await multi._call(_DELETE_EXPIRED_COMPLETED, None, ["default"], args) == [0, 0]
    await _completed(broker, "default", "c9")
    clock.now += 60
    args = (int(clock.now), 3, _PROBE_CHUNK)
    assert await multi._call(_DELETE_EXPIRED_COMPLETED, None, ["default"], args) == [1, 0]
    # Through the janitor: batches of 2 until no queue fills one.
    await _completed(broker, "a", *(f"a{i}" for i in range(5)))
    await _completed(broker, "b", "b0")
    clock.now += 60
    assert await multi.delete_expired_completed(["a", "b"], batch_size=2) == 6
    assert await redis.zcard(keys.completed_key("a")) == 0
    assert await redis.zcard(keys.completed_key("b")) == 0
    assert await redis.keys("asynq:{?}:t:*") == []


async def test_forward_drops_a_due_id_without_a_task_hash(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # An id whose hash is gone cannot become a task: it leaves the scheduled and retry
    # sets (nothing is pushed), so the next pass does not find it again.
    due = clock.now - 5
    await redis.zadd(keys.scheduled_key("default"), {"gone-s": due})
    await redis.zadd(keys.retry_key("default"), {"gone-r": due})
    await broker.schedule(make_msg("kept", "default"), clock.dt - timedelta(seconds=5))

    assert await broker.forward_queues(["default"]) == 3

    assert await redis.zcard(keys.scheduled_key("default")) == 0
    assert await redis.zcard(keys.retry_key("default")) == 0
    assert await redis.lrange(keys.pending_key("default"), 0, -1) == [b"kept"]
    assert not await redis.exists(keys.task_key("default", "gone-s"))
    assert await broker.forward_queues(["default"]) == 0


@pytest.mark.parametrize("probe", [1, 2, 200])
async def test_forward_finds_a_queue_whose_only_due_task_is_a_retry(
    broker: Broker, redis: Redis, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, probe: int
) -> None:
    # The probe of a chunk names each queue's retry set beside its scheduled set.
    from asyncq._broker import multiqueue

    monkeypatch.setattr(multiqueue, "_PROBE_CHUNK", probe)
    msg = make_msg("r1", "r")
    await redis.hset(keys.task_key("r", "r1"), mapping={"msg": bytes(msg), "state": "retry"})
    await redis.zadd(keys.retry_key("r"), {"r1": clock.now - 5})

    assert await broker.forward_queues(["e1", "r", "e2"]) == 1

    assert await redis.lrange(keys.pending_key("r"), 0, -1) == [b"r1"]
    assert await redis.hget(keys.task_key("r", "r1"), "state") == b"pending"
    assert await redis.zcard(keys.retry_key("r")) == 0


async def test_periodic_passes_over_idle_queues_run_only_their_probes(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # One EXISTS per 200 queues finds nothing to do: over idle queues the forwarder, the
    # lease scan, the janitor and the reclaim run nothing else inside Redis.
    names = [f"idle{i:03d}" for i in range(2 * _PROBE_CHUNK)]
    before = await command_calls(redis)

    assert await broker.forward_queues(names) == 0
    assert await broker.scan_leases(clock.dt, names) == ([], None)
    assert await broker.delete_expired_completed_queues(names) == 0
    await broker.reclaim_stale_aggregation_sets_queues(names)

    calls = delta(await command_calls(redis), before)
    assert {k: n for k, n in calls.items() if k in IN_SCRIPT} == {"exists": 4 * 2}, calls


async def test_reclaim_puts_every_member_of_a_stale_set_back(
    broker: Broker, redis: Redis, clock: FakeClock
) -> None:
    # Every member goes back with its score; a stale entry whose set is gone adds no
    # group; a set before its deadline stays staged.
    q = "default"
    stale = keys.aggregation_set_key(q, "grp", "s1")
    gone = keys.aggregation_set_key(q, "empty", "s2")
    fresh = keys.aggregation_set_key(q, "later", "s3")
    await redis.zadd(stale, {"m1": 5.0, "m2": 6.0, "m3": 7.0})
    await redis.zadd(fresh, {"f1": 8.0})
    await redis.zadd(
        keys.all_aggregation_sets(q),
        {stale: clock.now - 100, gone: clock.now - 50, fresh: clock.now + 100},
    )

    await broker.reclaim_stale_aggregation_sets_queues([q])

    assert await redis.zrange(keys.group_key(q, "grp"), 0, -1, withscores=True) == [
        (b"m1", 5.0),
        (b"m2", 6.0),
        (b"m3", 7.0),
    ]
    assert await redis.smembers(keys.all_groups(q)) == {b"grp"}
    assert not await redis.exists(stale)
    assert await redis.zrange(keys.all_aggregation_sets(q), 0, -1) == [fresh.encode()]
    assert await redis.zrange(fresh, 0, -1) == [b"f1"]
