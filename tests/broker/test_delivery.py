"""Direct delivery: an asyncq enqueue gives its task to an idle worker (no fetch).

Against a real Redis: the scripts' writes (the task is active with the worker's lease,
as a dequeue leaves it, byte for byte as Go asynq's golden active task), the cases that
must not deliver (no listener, no credit, paused, limited, ordered, tasks waiting, a
member no worker wrote), two idle servers sharing the work, and a delivered task
surviving the SIGKILL of the worker it was delivered to.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.delivery import WAITERS_TTL, DeliveryNote, delivered_message, parse_note
from asyncq._producer.client import Client
from asyncq._worker.server import Server
from asyncq.mux import ServeMux
from asyncq.task import Task
from tests.support import golden
from tests.support.helpers import FakeClock, delivery_notes
from tests.support.procs import FAST, fast, spawn, stop_process, wait_for_line, wait_until
from tests.support.workers.worker import DONE, STARTS

SERVER = "test-server-1"


async def test_a_delivered_task_is_active_with_the_workers_lease_as_go_writes_it(
    redis: Redis, broker: Broker, client: Client
) -> None:
    async with delivery_notes(redis, SERVER) as notes:
        assert await broker.arm_delivery(SERVER, 15.0, ["work"])
        waiters = keys.waiters_key("work")
        assert await redis.lrange(waiters, 0, -1) == [broker.delivery_member(SERVER).encode()]
        assert 0 < await redis.ttl(waiters) <= WAITERS_TTL
        # The golden w-active task of Go asynq v0.26, enqueued by asyncq.
        await client.enqueue(
            Task("golden:block", b"block-me"),
            queue="work",
            task_id="w-active",
            timeout=timedelta(seconds=600),
        )
        note = parse_note(await asyncio.wait_for(notes.get(), 5))
        assert (note.queue, note.task_id) == ("work", "w-active")
        # Exactly what Go asynq left for its active task: hash, active list, lease.
        go = golden.snapshot_keys()
        task_key = keys.task_key("work", "w-active")
        assert await redis.hgetall(task_key) == go[task_key].raw
        assert note.data == go[task_key].raw[b"msg"]
        assert await redis.lrange(keys.active_key("work"), 0, -1) == [b"w-active"]
        assert await redis.zscore(keys.lease_key("work"), "w-active") == note.lease_expiry
        assert not await redis.exists(keys.pending_key("work"))
        # The credit is spent: the next task waits in pending, as Go asynq writes it.
        assert await redis.get(keys.delivery_channel(SERVER)) == b"0"
        await client.enqueue(Task("t"), queue="work", task_id="second")
        assert await redis.lrange(keys.pending_key("work"), 0, -1) == [b"second"]
        stored = await redis.hgetall(keys.task_key("work", "second"))
        assert set(stored) == {b"msg", b"state", b"pending_since"}
        assert stored[b"state"] == b"pending"
        assert notes.empty()
        # The task is then a dequeued task like any other: its completion is asynq's.
        msg = delivered_message(note)
        assert msg is not None and msg.id == "w-active"
        await broker.done(msg)
        assert not await redis.exists(task_key)
        assert await redis.lrange(keys.active_key("work"), 0, -1) == []
        assert await redis.zcard(keys.lease_key("work")) == 0
        assert await redis.get(keys.processed_total_key("work")) == b"1"


async def test_nobody_listening_writes_the_task_pending_and_drops_the_credit(
    redis: Redis, broker: Broker, client: Client
) -> None:
    assert await broker.arm_delivery(SERVER, 15.0, ["q"])  # armed, but no subscriber
    await client.enqueue(Task("t"), queue="q", task_id="a")
    assert await redis.lrange(keys.pending_key("q"), 0, -1) == [b"a"]
    assert await redis.hget(keys.task_key("q", "a"), "state") == b"pending"
    assert not await redis.exists(keys.delivery_channel(SERVER))
    assert not await redis.exists(keys.active_key("q"))
    # Its credit gone, the member is dropped by the next enqueue; a live worker writes
    # itself back when it arms again (the credit expired).
    await redis.delete(keys.pending_key("q"))
    await client.enqueue(Task("t"), queue="q", task_id="b")
    assert await redis.lrange(keys.waiters_key("q"), 0, -1) == []
    assert not await broker.arm_delivery(SERVER, 15.0)
    assert await broker.arm_delivery(SERVER, 15.0, ["q"])
    assert await redis.llen(keys.waiters_key("q")) == 1


@pytest.mark.parametrize(
    "setup", ["paused", "limit", "ordered", "waiting", "active_type", "lease_type"]
)
async def test_no_delivery_where_the_dequeue_script_must_decide(
    redis: Redis, broker: Broker, client: Client, setup: str
) -> None:
    async with delivery_notes(redis, SERVER) as notes:
        if setup == "paused":
            await redis.set(keys.paused_key("q"), 1)
        elif setup == "limit":  # a limit of 1, taken by a live lease
            await redis.set(keys.limit_key("q"), 1)
            await redis.zadd(keys.lease_key("q"), {"busy": time.time() + 600})
        elif setup == "ordered":  # an ordered queue with a task running
            await redis.set(keys.ordered_key("q"), "1")
            await redis.lpush(keys.active_key("q"), "busy")
        elif setup.endswith("_type"):  # a key of another type where the task would go
            await redis.set((keys.active_key if setup == "active_type" else keys.lease_key)("q"), 1)
        else:
            await client.enqueue(Task("t"), queue="q", task_id="first")
        assert await broker.arm_delivery(SERVER, 15.0, ["q"])
        await client.enqueue(Task("t"), queue="q", task_id="x")
        assert b"x" in await redis.lrange(keys.pending_key("q"), 0, -1)
        assert await redis.hget(keys.task_key("q", "x"), "state") == b"pending"
        assert await redis.get(keys.delivery_channel(SERVER)) == b"1"  # credit kept
        if setup == "waiting":
            # FIFO: the waiting task stays first in line.
            assert await redis.lrange(keys.pending_key("q"), 0, -1) == [b"x", b"first"]
        assert notes.empty()


async def test_an_unusable_delivered_message_is_archived_as_a_fetch_would(
    redis: Redis, broker: Broker, client: Client
) -> None:
    async with delivery_notes(redis, SERVER) as notes:
        assert await broker.arm_delivery(SERVER, 15.0, ["q"])
        await client.enqueue(Task("t"), queue="q", task_id="a")
        note = parse_note(await asyncio.wait_for(notes.get(), 5))
    assert delivered_message(note) is not None
    for bad in (
        DeliveryNote(note.lease_expiry, "q", "a", b"\xff not protobuf"),
        DeliveryNote(note.lease_expiry, "other", "a", note.data),  # names another queue
    ):
        assert delivered_message(bad) is None
    await broker.reject_delivered(DeliveryNote(note.lease_expiry, "q", "a", b"\xff"))
    stored = await redis.hgetall(keys.task_key("q", "a"))
    assert stored[b"state"] == b"archived"
    assert b"cannot decode task message" in stored[b"asyncq_error"]
    assert await redis.zscore(keys.archived_key("q"), "a") is not None
    assert await redis.zcard(keys.lease_key("q")) == 0
    with pytest.raises(ValueError, match="is usable"):
        await broker.reject_delivered(note)


async def test_a_member_no_worker_wrote_is_dropped_and_its_key_untouched(
    redis: Redis, client: Client
) -> None:
    # Someone with write access put junk into the list; a counter elsewhere is not a credit.
    await redis.set("victim", 5)
    await redis.rpush(keys.waiters_key("q"), "30:victim", "x", "abc:asyncq:delivery:s")
    await client.enqueue(Task("t"), queue="q", task_id="a")
    assert await redis.get("victim") == b"5"
    assert await redis.lrange(keys.waiters_key("q"), 0, -1) == []
    assert await redis.lrange(keys.pending_key("q"), 0, -1) == [b"a"]


async def test_an_enqueue_looks_at_four_waiters_at_most(
    redis: Redis, broker: Broker, client: Client
) -> None:
    # A live waiter at the head, four departed ones (no credit) behind it at the tail.
    async with delivery_notes(redis, SERVER) as notes:
        assert await broker.arm_delivery(SERVER, 15.0, ["q"])
        departed = [f"30:asyncq:delivery:gone-{i}" for i in range(4)]
        await redis.rpush(keys.waiters_key("q"), *departed)
        await client.enqueue(Task("t"), queue="q", task_id="a")
        # Four looked at, four dropped: the live one is not reached this time...
        assert await redis.lrange(keys.pending_key("q"), 0, -1) == [b"a"]
        live = broker.delivery_member(SERVER).encode()
        assert await redis.lrange(keys.waiters_key("q"), 0, -1) == [live]
        # ...and is delivered the next task once the queue is empty again.
        await redis.delete(keys.pending_key("q"))
        await client.enqueue(Task("t"), queue="q", task_id="b")
        assert parse_note(await asyncio.wait_for(notes.get(), 5)).task_id == "b"


async def test_a_member_written_many_times_never_fails_an_enqueue(
    redis: Redis, client: Client
) -> None:
    # One LREM drops every copy, so the list runs out before the tries do.
    await redis.rpush(keys.waiters_key("q"), *["x"] * 5)
    await client.enqueue(Task("t"), queue="q", task_id="a")
    assert await redis.lrange(keys.pending_key("q"), 0, -1) == [b"a"]
    assert not await redis.exists(keys.waiters_key("q"))


async def test_a_credit_that_is_no_number_is_no_credit(
    redis: Redis, broker: Broker, client: Client
) -> None:
    async with delivery_notes(redis, SERVER) as notes:
        assert await broker.arm_delivery(SERVER, 15.0, ["q"])
        await redis.set(keys.delivery_channel(SERVER), "junk")
        await client.enqueue(Task("t"), queue="q", task_id="a")
        assert await redis.lrange(keys.pending_key("q"), 0, -1) == [b"a"]
        assert await redis.get(keys.delivery_channel(SERVER)) == b"junk"
        assert notes.empty()


async def test_a_hostile_waiters_key_never_fails_an_enqueue(redis: Redis, client: Client) -> None:
    await redis.set(keys.waiters_key("q"), "not a list")
    await client.enqueue(Task("t"), queue="q", task_id="a")
    assert await redis.lrange(keys.pending_key("q"), 0, -1) == [b"a"]


async def test_disarm_leaves_every_list_and_drops_the_credit(redis: Redis, broker: Broker) -> None:
    other = "other-server"
    assert await broker.arm_delivery(SERVER, 15.0, ["a", "b"])
    assert await broker.arm_delivery(other, 15.0, ["a"])
    await broker.disarm_delivery(SERVER, ["a", "b"])
    assert not await redis.exists(keys.delivery_channel(SERVER))
    assert await redis.lrange(keys.waiters_key("a"), 0, -1) == [
        broker.delivery_member(other).encode()
    ]
    assert not await redis.exists(keys.waiters_key("b"))


async def test_arming_renews_without_rewriting_the_lists(redis: Redis, clock: FakeClock) -> None:
    broker = Broker(redis, clock=clock)
    assert await broker.arm_delivery(SERVER, 15.0, ["q"])
    await redis.set(keys.delivery_channel(SERVER), 0)  # spent by a delivery
    assert await broker.arm_delivery(SERVER, 2.5)
    assert await redis.get(keys.delivery_channel(SERVER)) == b"1"
    assert 0 < await redis.pttl(keys.delivery_channel(SERVER)) <= 2500
    assert await redis.llen(keys.waiters_key("q")) == 1


async def test_arming_leaves_one_copy_of_the_member_in_each_list(
    redis: Redis, broker: Broker
) -> None:
    member = broker.delivery_member(SERVER)
    await redis.rpush(keys.waiters_key("q"), member, "other", member)  # copies by hand
    assert await broker.arm_delivery(SERVER, 15.0, ["q"])
    assert await redis.lrange(keys.waiters_key("q"), 0, -1) == [member.encode(), b"other"]


async def test_disarming_drops_every_copy_of_the_member(redis: Redis, broker: Broker) -> None:
    member = broker.delivery_member(SERVER)
    await redis.rpush(keys.waiters_key("q"), member, "other", member)  # copies by hand
    await broker.disarm_delivery(SERVER, ["q"])
    assert await redis.lrange(keys.waiters_key("q"), 0, -1) == [b"other"]


def _mux(record: list[tuple[str, str]]) -> ServeMux:
    mux = ServeMux()

    async def handle(task: Task) -> None:
        record.append((task.queue or "", task.id or ""))

    mux.handle("t", handle)
    return mux


async def test_an_idle_server_runs_delivered_tasks_without_fetching(
    redis: Redis, client: Client
) -> None:
    ran: list[tuple[str, str]] = []
    server = Server(redis, queues={"default": 1}, concurrency=4, **FAST)
    await server.start(_mux(ran))
    credit = keys.delivery_channel(server.server_id)

    async def armed() -> bool:
        return await redis.get(credit) == b"1"

    try:
        await wait_until(armed, what="the server to ask for delivery")
        fetches = server.stats.empty_fetches
        for i in range(20):
            # The server asks again once it started the last one: no enqueue goes before.
            await wait_until(armed, what=f"the server to ask again before t{i}")
            await client.enqueue(Task("t"), task_id=f"t{i}")
            await wait_until(lambda i=i: ("default", f"t{i}") in ran, what=f"task t{i}")
        assert server.stats.delivered == 20
        assert server.stats.succeeded == 20
        # Each delivery is answered by re-arming, not by a fetch (those are the idle polls).
        assert server.stats.empty_fetches - fetches < 20
    finally:
        await server.shutdown()
    # Gone from the lists and its credit dropped: nothing of it is left in Redis.
    assert not await redis.exists(keys.delivery_channel(server.server_id))
    assert not await redis.exists(keys.waiters_key("default"))


async def test_two_idle_servers_share_delivered_tasks_across_weighted_queues(
    redis: Redis, client: Client
) -> None:
    ran: dict[str, list[tuple[str, str]]] = {"a": [], "b": []}
    queues = {"high": 3, "low": 1}
    servers = {name: Server(redis, queues=queues, concurrency=2, **FAST) for name in ("a", "b")}
    for name, server in servers.items():
        await server.start(_mux(ran[name]))
    credits = [keys.delivery_channel(s.server_id) for s in servers.values()]

    async def both_armed() -> bool:
        return await redis.mget(credits) == [b"1", b"1"]

    try:
        n = 40
        for i in range(n):
            # Both ask again once they started their last task: no enqueue goes before.
            await wait_until(both_armed, what=f"both servers to ask before t{i}")
            queue = "high" if i % 2 else "low"
            await client.enqueue(Task("t"), queue=queue, task_id=f"t{i}")
            await wait_until(
                lambda i=i: any(r[1] == f"t{i}" for s in ran.values() for r in s),
                what=f"task t{i}",
            )
        everything = [r for s in ran.values() for r in s]
        assert sorted(r[1] for r in everything) == sorted(f"t{i}" for i in range(n))
        share = {name: len(r) for name, r in ran.items()}
        # Turn by turn through the waiters lists: each server gets a fair part.
        assert min(share.values()) >= n // 4, share
        per_queue = Counter(q for q, _ in everything)
        assert per_queue == {"high": n // 2, "low": n // 2}
        assert sum(s.stats.delivered for s in servers.values()) >= n // 2
    finally:
        for server in servers.values():
            await server.shutdown()


@pytest.mark.subprocess
async def test_a_task_delivered_to_a_worker_killed_before_it_finished_runs_again_once(
    redis_url: str, redis: Redis, client: Client
) -> None:
    # A worker process, idle and armed, is delivered a task, then SIGKILLed while the handler
    # runs; the lease it held expires, and another worker runs the task to its end.
    proc = spawn("worker.py", redis_url, "lease=2", "heartbeat=0.3", "concurrency=2")
    watch = redis.pubsub()
    try:
        await wait_for_line(proc, "send signal TERM or INT")
        armed = await wait_until(
            lambda: redis.keys(keys.delivery_channel("*")), what="the worker to arm"
        )
        await watch.subscribe(armed[0])  # sees what is delivered to the worker
        await client.enqueue(Task("work", b"600000"), task_id="delivered")
        await wait_until(lambda: redis.lrange(STARTS, 0, -1), what="the handler to start")
        notes = []
        while (msg := await watch.get_message(timeout=0.5)) is not None:
            if msg["type"] == "message":
                notes.append(parse_note(msg["data"]).task_id)
        assert notes == ["delivered"]  # delivered, not fetched
        stored = await redis.hgetall(keys.task_key("default", "delivered"))
        assert stored[b"state"] == b"active" and b"pending_since" not in stored
        assert await redis.zscore(keys.lease_key("default"), "delivered") is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        stop_process(proc)
        await watch.aclose()
    ran: list[tuple[str, str]] = []
    mux = ServeMux()

    async def work(task: Task) -> None:
        ran.append((task.queue or "", task.id or ""))
        await redis.hincrby(DONE, task.id or "", 1)

    mux.handle("work", work)
    server = Server(
        redis,
        lease_duration=timedelta(seconds=2),
        retry_delay=lambda n, e, t: timedelta(0),
        **fast(recoverer_cutoff=timedelta(seconds=0.5)),
    )
    await server.start(mux)
    try:
        await wait_until(lambda: ran, within=30, what="the recovered task")
        await asyncio.sleep(0.5)
        assert ran == [("default", "delivered")]
        assert await redis.hget(DONE, "delivered") == b"1"
        assert not await redis.exists(keys.task_key("default", "delivered"))
    finally:
        await server.shutdown()
