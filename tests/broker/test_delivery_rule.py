"""Direct delivery under one rule, one clock, and whatever Redis holds.

Against a real Redis: an enqueue delivers its task exactly when the waiting worker's
fetch would take it (paused, limited, ordered, another worker's rate: the rule of
_lib/room.lua, shared by enqueue.lua and dequeue_queues.lua); the delivered lease runs from the
enqueuer's clock, as a fetched one runs from the fetcher's; a waiters member no worker
wrote (odd lease seconds, a credit of another type) is dropped, named, and costs no
task; a pattern subscriber does not make a worker that is gone look alive.
"""

from __future__ import annotations

import asyncio
import math
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.delivery import parse_note
from asyncq._producer.client import Client
from asyncq._worker.server import Server
from asyncq.errors import BrokerError
from asyncq.mux import ServeMux
from asyncq.task import Task
from tests.support.acl import temporary_acl_user
from tests.support.helpers import FakeClock, delivery_notes, make_msg
from tests.support.procs import FAST, spawn, stop_process, wait_for_line, wait_until

SERVER = "rule-server"
Q = "q"


@dataclass(frozen=True)
class QueueState:
    """What a fetch and a delivery both look at before giving the queue's next task."""

    paused: bool
    limit: int | None  # stored asynq:{q}:asyncq:limit
    live: int  # ids in active with a lease still running
    dead: int  # ids in active whose lease expired (a killed worker's)
    ordered: bool
    retry: bool  # a task in the retry set
    rate: str | None  # another worker's bucket: None, "full" or "empty" for a long while


_states = st.builds(
    QueueState,
    paused=st.booleans(),
    limit=st.none() | st.integers(0, 3),
    live=st.integers(0, 2),
    dead=st.integers(0, 2),
    ordered=st.booleans(),
    retry=st.booleans(),
    rate=st.sampled_from([None, "full", "empty"]),
)

RATE = (1_000_000, 1)  # the other worker's: a task a second, a burst of one


async def _seed(redis: Redis, now: float, state: QueueState) -> int | None:
    """A flushed database holding *state*; the rate bucket's tat written (None: no bucket)."""
    await redis.flushdb()
    if state.paused:
        await redis.set(keys.paused_key(Q), "1")
    if state.limit is not None:
        await redis.set(keys.limit_key(Q), state.limit)
    for i in range(state.live):
        await redis.lpush(keys.active_key(Q), f"live{i}")
        await redis.zadd(keys.lease_key(Q), {f"live{i}": now + 600})
    for i in range(state.dead):
        await redis.lpush(keys.active_key(Q), f"dead{i}")
        await redis.zadd(keys.lease_key(Q), {f"dead{i}": now - 600})
    if state.ordered:
        await redis.set(keys.ordered_key(Q), "1")
    if state.retry:
        await redis.zadd(keys.retry_key(Q), {"failed": now + 600})
    if state.rate is None:
        return None
    secs, micros = await redis.time()
    tat = 0 if state.rate == "full" else (secs + 600) * 1_000_000 + micros
    iv, burst = RATE
    await redis.hset(keys.rate_key(Q), mapping={"tat": tat, "interval": iv, "burst": burst})
    return tat


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(state=_states)
async def test_an_enqueue_delivers_exactly_when_a_fetch_would_take_the_task(
    redis: Redis, broker: Broker, clock: FakeClock, state: QueueState
) -> None:
    # What the waiting worker's fetch does with the task in that state (it has no limit nor
    # rate of its own: a worker with one for the queue does not wait for deliveries)...
    await _seed(redis, clock.now, state)
    await broker.enqueue(make_msg("x", queue=Q))
    fetched = await broker.fetch([Q], 1)
    taken = [t.message.id for t in fetched.tasks] == ["x"]
    # ...is what an enqueue does with a waiting worker: deliver it, or leave it pending.
    tat = await _seed(redis, clock.now, state)
    async with delivery_notes(redis, SERVER) as notes:
        assert await broker.arm_delivery(SERVER, 15.0, [Q])
        await broker.enqueue(make_msg("x", queue=Q))
        state_after = await redis.hget(keys.task_key(Q, "x"), "state")
        assert state_after == (b"active" if taken else b"pending"), state
        if taken:
            note = parse_note(await asyncio.wait_for(notes.get(), 5))
            assert note.task_id == "x"
        else:
            assert await redis.get(keys.delivery_channel(SERVER)) == b"1"  # credit kept
    if tat is not None:  # another worker's bucket: a delivery takes none of its tokens
        assert await redis.hget(keys.rate_key(Q), "tat") == str(tat).encode()


async def test_the_delivered_lease_runs_from_the_enqueuers_clock(
    redis: Redis, broker: Broker, clock: FakeClock
) -> None:
    # The enqueuer's clock an hour and a half second off Redis': the lease follows it, as a
    # fetched task's follows the fetcher's (Redis TIME would ignore it).
    clock.now += 3600.5
    async with delivery_notes(redis, SERVER) as notes:
        assert await broker.arm_delivery(SERVER, 15.0, [Q])
        await broker.enqueue(make_msg("x", queue=Q))
        note = parse_note(await asyncio.wait_for(notes.get(), 5))
    expiry = int(clock.now) + int(broker.lease_duration)
    assert note.lease_expiry == expiry
    assert await redis.zscore(keys.lease_key(Q), "x") == expiry


async def test_a_stored_limit_counts_live_leases_by_the_enqueuers_clock(
    redis: Redis, broker: Broker, clock: FakeClock
) -> None:
    # A limit of 1 and one lease ending in 100 s: held now, free once the enqueuer's clock
    # is past it (a fetch at that time would take the task too).
    await redis.set(keys.limit_key(Q), 1)
    await redis.zadd(keys.lease_key(Q), {"other": clock.now + 100})
    async with delivery_notes(redis, SERVER) as notes:
        assert await broker.arm_delivery(SERVER, 15.0, [Q])
        await broker.enqueue(make_msg("x", queue=Q))
        assert await redis.hget(keys.task_key(Q, "x"), "state") == b"pending"
        await redis.delete(keys.pending_key(Q))
        clock.now += 101
        await broker.enqueue(make_msg("y", queue=Q))
        assert parse_note(await asyncio.wait_for(notes.get(), 5)).task_id == "y"


@pytest.mark.parametrize("waiting", [False, True])
async def test_a_registry_of_another_type_fails_the_enqueue_with_nothing_written(
    redis: Redis, broker: Broker, waiting: bool
) -> None:
    # asynq:queues is checked before any write, whether the task would go pending or be
    # delivered: the error names the key, and no note goes out.
    await redis.set(keys.ALL_QUEUES, "not a set")
    async with delivery_notes(redis, SERVER) as notes:
        if waiting:
            assert await broker.arm_delivery(SERVER, 15.0, [Q])
        before = {k: await redis.dump(k) for k in await redis.keys("*")}
        with pytest.raises(BrokerError, match="asynq:queues is not a set"):
            await broker.enqueue(make_msg("x", queue=Q))
        assert {k: await redis.dump(k) for k in await redis.keys("*")} == before
        assert notes.empty()


# -- a waiters member no worker wrote ---------------------------------------------------------

_BAD_SECONDS = ["nan", "inf", "-inf", "1e300", "0x10", "-100", "2.5", "0", "", " 30", "9" * 16]


async def _check_after_enqueue(redis: Redis, task_id: str) -> None:
    """The task is acknowledged and either pending, or active with a finite lease."""
    stored = await redis.hgetall(keys.task_key(Q, task_id))
    if stored[b"state"] == b"pending":
        assert task_id.encode() in await redis.lrange(keys.pending_key(Q), 0, -1)
        assert await redis.zscore(keys.lease_key(Q), task_id) is None
    else:
        assert stored[b"state"] == b"active"
        lease = await redis.zscore(keys.lease_key(Q), task_id)
        assert lease is not None and math.isfinite(lease)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    secs=st.sampled_from(_BAD_SECONDS)
    | st.text(min_size=0, max_size=20).filter(lambda s: not s.isascii() or not s.isdigit())
    | st.integers(max_value=0).map(str)
    | st.floats().map(str)
)
async def test_a_member_with_odd_lease_seconds_is_dropped_named_and_costs_no_task(
    redis: Redis, broker: Broker, secs: str
) -> None:
    await redis.flushdb()
    async with delivery_notes(redis, SERVER) as notes:
        # A live worker with credit, written into the list under odd lease seconds.
        assert await broker.arm_delivery(SERVER, 15.0, [Q])
        member = f"{secs}:{keys.delivery_channel(SERVER)}"
        await redis.delete(keys.waiters_key(Q))
        await redis.rpush(keys.waiters_key(Q), member)
        with structlog.testing.capture_logs() as logs:
            await broker.enqueue(make_msg("x", queue=Q))
        await _check_after_enqueue(redis, "x")
        assert await redis.hget(keys.task_key(Q, "x"), "state") == b"pending"
        assert await redis.get(keys.delivery_channel(SERVER)) == b"1"  # untouched
        assert notes.empty()
    assert not await redis.exists(keys.waiters_key(Q))
    named = [e for e in logs if e.get("key") == keys.waiters_key(Q)]
    assert [(e["log_level"], e["member"]) for e in named] == [("warning", member)]


async def test_each_bad_member_is_named_once_and_a_live_worker_behind_them_is_reached(
    redis: Redis, broker: Broker
) -> None:
    # Three bad members at the tail, the live worker at the head: one enqueue drops all
    # three and still delivers (four looks), the next finds nothing to drop.
    async with delivery_notes(redis, SERVER) as notes:
        assert await broker.arm_delivery(SERVER, 15.0, [Q])
        channel = keys.delivery_channel(SERVER)
        bad = [f"nan:{channel}", f"inf:{channel}", f"1e300:{channel}"]
        await redis.rpush(keys.waiters_key(Q), *bad)
        with structlog.testing.capture_logs() as logs:
            await broker.enqueue(make_msg("x", queue=Q))
            note = parse_note(await asyncio.wait_for(notes.get(), 5))
        assert note.task_id == "x"
        await _check_after_enqueue(redis, "x")
        assert sorted(e["member"] for e in logs if e.get("member")) == sorted(bad)
        assert await redis.lrange(keys.waiters_key(Q), 0, -1) == [
            broker.delivery_member(SERVER).encode()
        ]


async def test_the_longest_lease_and_largest_credit_a_member_may_name_are_taken(
    redis: Redis, broker: Broker, clock: FakeClock
) -> None:
    # 15 digits of lease seconds and an 18-digit credit: still exact integers, so the task is
    # delivered with a finite lease and the credit goes down by one.
    secs, credit = 10**15 - 1, "9" * 18
    async with delivery_notes(redis, SERVER) as notes:
        channel = keys.delivery_channel(SERVER)
        await redis.set(channel, credit)
        await redis.rpush(keys.waiters_key(Q), f"{secs}:{channel}")
        await broker.enqueue(make_msg("x", queue=Q))
        note = parse_note(await asyncio.wait_for(notes.get(), 5))
    assert note.lease_expiry == int(clock.now) + secs
    assert await redis.zscore(keys.lease_key(Q), "x") == note.lease_expiry
    assert await redis.get(channel) == str(int(credit) - 1).encode()


async def test_a_departed_workers_member_is_dropped_without_a_warning(
    redis: Redis, broker: Broker
) -> None:
    # Its credit expired: the usual end of a worker, not a value to report.
    assert await broker.arm_delivery(SERVER, 15.0, [Q])
    await redis.delete(keys.delivery_channel(SERVER))
    with structlog.testing.capture_logs() as logs:
        await broker.enqueue(make_msg("x", queue=Q))
    assert not await redis.exists(keys.waiters_key(Q))
    assert await redis.hget(keys.task_key(Q, "x"), "state") == b"pending"
    assert [e for e in logs if e.get("key") == keys.waiters_key(Q)] == []


async def test_a_departed_workers_member_written_many_times_goes_in_one_look(
    redis: Redis, broker: Broker
) -> None:
    member = f"30:{keys.delivery_channel('gone')}"  # no credit: a departed worker
    await redis.rpush(keys.waiters_key(Q), *[member] * 6)
    await broker.enqueue(make_msg("x", queue=Q))
    assert not await redis.exists(keys.waiters_key(Q))


@pytest.mark.parametrize("rules", [("-pubsub",), ("resetchannels",)])
async def test_a_user_refused_pubsub_numsub_or_the_channel_enqueues_pending(
    redis_url: str, redis: Redis, rules: tuple[str, ...]
) -> None:
    # A producer whose ACL forbids PUBSUB, or every channel: a worker waits with credit and
    # listens, and the task is written pending, the credit kept.
    async with delivery_notes(redis, SERVER) as notes:
        assert await Broker(redis).arm_delivery(SERVER, 15.0, [Q])
        allowed = (
            ("~*", "+@all", *rules) if "resetchannels" in rules else ("~*", "&*", "+@all", *rules)
        )
        async with temporary_acl_user(redis, redis_url, "nodeliver", *allowed) as url:
            limited = Redis.from_url(url)
            try:
                await Broker(limited).enqueue(make_msg("x", queue=Q))
            finally:
                await limited.aclose()
        assert await redis.hget(keys.task_key(Q, "x"), "state") == b"pending"
        assert await redis.get(keys.delivery_channel(SERVER)) == b"1"
        assert notes.empty()


async def _set_as(redis: Redis, key: str, kind: str) -> None:
    await redis.delete(key)
    if kind == "list":
        await redis.rpush(key, "1")
    elif kind == "hash":
        await redis.hset(key, "credit", "1")
    elif kind == "zset":
        await redis.zadd(key, {"1": 1})
    else:
        await redis.set(key, kind)  # a string that is no count DECR could take


async def test_a_credit_of_another_type_or_no_count_is_dropped_named_and_costs_no_task(
    redis: Redis, client: Client
) -> None:
    # Each kind in turn, with a subscriber on the channel: before, a list stayed forever,
    # and "1.5", "01" or a 19-digit credit (past the largest integer) was published and
    # then failed the DECR half-written.
    async with delivery_notes(redis, SERVER):
        channel = keys.delivery_channel(SERVER)
        member = f"30:{channel}"
        for i, kind in enumerate(["list", "hash", "zset", "1.5", "9" * 19, "-1x", "01"]):
            await _set_as(redis, channel, kind)
            await redis.rpush(keys.waiters_key(Q), member)
            with structlog.testing.capture_logs() as logs:
                await client.enqueue(Task("t"), queue=Q, task_id=f"t{i}")
            await _check_after_enqueue(redis, f"t{i}")
            assert await redis.hget(keys.task_key(Q, f"t{i}"), "state") == b"pending", kind
            assert not await redis.exists(keys.waiters_key(Q)), kind
            named = [e["member"] for e in logs if e.get("key") == keys.waiters_key(Q)]
            assert named == [member], kind
            typed = kind in ("list", "hash", "zset")
            assert await redis.type(channel) == (kind.encode() if typed else b"string")
            await redis.delete(keys.pending_key(Q))


# -- a pattern subscriber ---------------------------------------------------------------------


@asynccontextmanager
async def _pattern_listener(redis: Redis) -> AsyncIterator[None]:
    """A monitoring client on ``asyncq:delivery:*`` and ``*`` (PUBLISH counts it)."""
    pubsub = redis.pubsub()
    await pubsub.psubscribe("asyncq:delivery:*", "*")
    try:
        await wait_until(lambda: pubsub.subscribed, what="the pattern subscription")
        yield
    finally:
        await pubsub.aclose()


async def test_a_pattern_subscriber_does_not_make_a_worker_that_never_listened_look_alive(
    redis: Redis, broker: Broker, client: Client
) -> None:
    async with _pattern_listener(redis):
        assert await broker.arm_delivery(SERVER, 15.0, [Q])  # armed, never subscribed
        await client.enqueue(Task("t"), queue=Q, task_id="a")
        assert await redis.lrange(keys.pending_key(Q), 0, -1) == [b"a"]
        assert await redis.hget(keys.task_key(Q, "a"), "state") == b"pending"
        assert not await redis.exists(keys.active_key(Q))
        assert not await redis.exists(keys.delivery_channel(SERVER))  # the credit is gone


@pytest.mark.subprocess
async def test_a_task_is_not_delivered_to_a_killed_worker_while_a_pattern_listens(
    redis_url: str, redis: Redis, client: Client
) -> None:
    # A worker process arms itself, is SIGKILLed, and a client listens on patterns: the next
    # task waits in pending (not in active under the dead worker's minute-long lease), and a
    # live worker runs it.
    async with _pattern_listener(redis):
        proc = spawn("worker.py", redis_url, "lease=60", "heartbeat=0.3", "concurrency=2")
        try:
            await wait_for_line(proc, "send signal TERM or INT")
            armed = await wait_until(
                lambda: redis.keys(keys.delivery_channel("*")), what="the worker to arm"
            )
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            stop_process(proc)

        async def gone() -> bool:
            reply = await redis.execute_command("PUBSUB", "NUMSUB", armed[0])
            return bool(reply[1] == 0)

        await wait_until(gone, what="Redis to drop the killed worker's subscription")
        await client.enqueue(Task("work", b"0"), task_id="after-kill")
        stored = await redis.hgetall(keys.task_key("default", "after-kill"))
        assert stored[b"state"] == b"pending"
        assert await redis.zscore(keys.lease_key("default"), "after-kill") is None
        assert not await redis.exists(armed[0])  # the dead worker's credit is dropped
        ran: list[str] = []
        mux = ServeMux()

        async def work(task: Task) -> None:
            ran.append(task.id or "")

        mux.handle("work", work)
        server = Server(redis, lease_duration=timedelta(seconds=60), **FAST)
        await server.start(mux)
        try:
            # Well within the dead worker's lease, which a delivery to it would have cost.
            await wait_until(lambda: ran, within=30, what="a live worker to run the task")
        finally:
            await server.shutdown()
        assert ran == ["after-kill"]


async def test_a_queue_its_limit_holds_is_held_before_its_order_is_read(
    redis: Redis, broker: Broker
) -> None:
    # A limit of 0 holds the queue: its ordered flag and retry set are not read, so a retry
    # key of another type is reported only once the queue could give a task.
    await broker.enqueue(make_msg("x", queue=Q))
    await redis.set(keys.limit_key(Q), 0)
    await redis.set(keys.ordered_key(Q), "1")
    await redis.set(keys.retry_key(Q), "not a zset")
    fetched = await broker.fetch([Q], 1)
    assert (fetched.tasks, fetched.held) == ([], {Q})
    await redis.delete(keys.limit_key(Q))
    with pytest.raises(BrokerError, match="is not a zset"):
        await broker.fetch([Q], 1)


async def test_an_ordered_queue_with_a_wrong_typed_retry_set_still_takes_the_enqueue(
    redis: Redis, broker: Broker
) -> None:
    # The retry set is read for an ordered queue's delivery: one of another type means no
    # delivery (the fetch reports it), never a failed enqueue.
    await redis.set(keys.ordered_key(Q), "1")
    await redis.set(keys.retry_key(Q), "not a zset")
    async with delivery_notes(redis, SERVER) as notes:
        assert await broker.arm_delivery(SERVER, 15.0, [Q])
        await broker.enqueue(make_msg("x", queue=Q))
        assert await redis.hget(keys.task_key(Q, "x"), "state") == b"pending"
        assert notes.empty()
