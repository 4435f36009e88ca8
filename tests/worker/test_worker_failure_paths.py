"""Failure scenarios from an audit of the worker runtime: task loss, wedges, slot leaks.

Bugs pinned here (each failed before its fix): a deadline beyond ``datetime``'s
range, a cancellation landing before the handler's first step, a handler that
ignores its cancellation, a handler returning while shutdown requeues another
task, burst mode exiting with a retry due now, a retry delay beyond
``datetime``'s range, an error handler raising CancelledError, messages whose
queue field is blank or wrong (recoverer, heartbeater, shutdown), a non-UTF-8
cancel message, outcomes handed to a syncer that already closed.

Behaviour checked and found correct, kept as regression tests: an outage longer
than the lease, a dequeue or ack whose reply was lost, a sync handler past its
timeout, a cancel message during the write phase.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncq import _keys as keys
from asyncq._broker import Broker, DequeuedTask
from asyncq._broker.multiqueue import FetchResult, MultiQueue
from asyncq._producer.client import Client
from asyncq._redis.options import RedisClientOpts
from asyncq._worker import active as active_module
from asyncq._worker.server import Server
from asyncq.errors import LeaseExpiredError, TaskCanceledError
from asyncq.mux import ServeMux
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task
from tests.support import transitions
from tests.support.helpers import one_handler, wait_gone, wait_state
from tests.support.procs import FAST, fast, list_ids, stored_message, wait_until
from tests.support.redis_server import RedisServer

Q = "default"
SERVE_CONCURRENCY = 2
HOUR = timedelta(hours=1)


def message(task_type: str, **fields: Any) -> TaskMessage:
    base: dict[str, Any] = {"queue": Q, "retry": 3, "timeout": 60}
    return TaskMessage(id=str(uuid.uuid4()), type=task_type, **{**base, **fields})


def slots_back(server: Server) -> Callable[[], bool]:
    proc = server.processor
    assert proc is not None
    return lambda: proc.slots.free == server.config.concurrency and not proc.active


# -- messages whose deadline lies beyond datetime's range ----------------------------------


@pytest.mark.parametrize(
    ("timeout_s", "deadline"),
    [
        (86_399_999_999_999, 0),  # what asyncq's client stores for timeout=timedelta.max
        (0, 2**62),
    ],
)
async def test_task_with_a_far_future_deadline_runs_and_is_heartbeated(
    redis: Redis, broker: Broker, serve: Callable[..., Any], timeout_s: int, deadline: int
) -> None:
    release = asyncio.Event()
    started: list[Task] = []

    async def handle(task: Task) -> None:
        started.append(task)
        await release.wait()

    server = await serve(one_handler("far", handle))
    msg = message("far", timeout=timeout_s, deadline=deadline)
    await broker.enqueue(msg)
    await wait_until(lambda: started, what="handler started")
    assert started[0].deadline == datetime.max.replace(tzinfo=UTC)
    workers = keys.workers_key(server.host, server.pid, server.server_id)

    async def heartbeated() -> bool:
        return bool(await redis.hexists(workers, msg.id))

    await wait_until(heartbeated, what="worker record written by the heartbeater")
    release.set()
    await wait_gone(redis, msg.id)
    assert server.stats.role_restarts["heartbeater"] == 0
    await wait_until(slots_back(server), what="slot returned")


async def test_task_with_a_deadline_before_year_one_fails_as_deadline_exceeded(
    redis: Redis, broker: Broker, serve: Callable[..., Any]
) -> None:
    ran: list[str] = []

    async def handle(task: Task) -> None:
        ran.append(task.id or "")

    server = await serve(one_handler("past", handle), retry_delay=lambda n, e, t: HOUR)
    msg = message("past", timeout=0, deadline=-(2**62))
    await broker.enqueue(msg)
    await wait_state(redis, msg.id, "retry")
    assert (await stored_message(redis, Q, msg.id)).error_msg == "context deadline exceeded"
    assert ran == []
    await wait_until(slots_back(server), what="slot returned")


# -- cancellation ------------------------------------------------------------------------------


async def test_cancel_landing_before_the_handler_starts_fails_the_task_and_frees_the_slot(
    redis: Redis, client: Client, serve: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []

    async def handle(task: Task) -> None:
        ran.append(task.id or "")

    server = await serve(one_handler("c", handle), retry_delay=lambda n, e, t: HOUR)
    proc = server.processor
    assert proc is not None
    start = proc._start

    def start_then_cancel(got: DequeuedTask) -> None:
        # A cancel message dispatched in the same event-loop turn as the fetch that
        # started the task: the task's coroutine has not run its first step yet.
        start(got)
        assert proc.active.cancel(got.message.id, TaskCanceledError()) is not None

    monkeypatch.setattr(proc, "_start", start_then_cancel)
    info = await client.enqueue(Task("c"))
    await wait_state(redis, info.id, "retry")
    msg = await stored_message(redis, Q, info.id)
    assert msg.error_msg == "context canceled"
    assert msg.retried == 1
    assert ran == []
    await wait_until(slots_back(server), what="slot returned")


async def test_handler_ignoring_its_timeout_is_failed_after_a_grace_and_frees_its_slot(
    redis: Redis, client: Client, serve: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(active_module, "CANCEL_GRACE", 0.2)
    resume = asyncio.Event()
    swallowed: list[str] = []
    done: list[str] = []

    async def stubborn(task: Task) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.append(task.id or "")  # swallowed: the handler goes on working
        await resume.wait()
        done.append(task.id or "")

    async def quick(task: Task) -> None:
        done.append(task.id or "")

    mux = ServeMux()
    mux.handle("stubborn", stubborn)
    mux.handle("quick", quick)
    server = await serve(mux, concurrency=1, retry_delay=lambda n, e, t: HOUR)
    proc = server.processor
    assert proc is not None
    info = await client.enqueue(Task("stubborn"), timeout=timedelta(seconds=1))
    await wait_until(lambda: info.id in proc.active, what="stubborn handler running")
    work = proc.active[info.id].task
    assert work is not None

    # Its failure is written although the handler has not returned...
    await wait_state(redis, info.id, "retry")
    msg = await stored_message(redis, Q, info.id)
    assert msg.error_msg == "context deadline exceeded"
    assert msg.retried == 1
    assert swallowed == [info.id]
    # ...and its slot serves the next task.
    other = await client.enqueue(Task("quick"))
    await wait_gone(redis, other.id)

    # When the handler finally returns nothing more is written and no slot is freed twice.
    # It runs on as an orphan (the task's own coroutine has written its failure and ended).
    (orphan,) = proc.orphans
    resume.set()
    await asyncio.wait_for(asyncio.shield(work), 10)
    await asyncio.wait_for(asyncio.shield(orphan), 10)
    assert done == [other.id, info.id]
    await wait_until(slots_back(server), what="slots returned")
    assert proc.slots.free == 1
    assert (await stored_message(redis, Q, info.id)).retried == 1
    assert await redis.zscore(keys.retry_key(Q), info.id) is not None


async def test_handler_swallowing_its_timeout_and_returning_is_a_failure(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    async def handle(task: Task) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return

    server = await serve(one_handler("s", handle), retry_delay=lambda n, e, t: HOUR)
    info = await client.enqueue(Task("s"), timeout=timedelta(seconds=1))
    await wait_state(redis, info.id, "retry")
    assert (await stored_message(redis, Q, info.id)).error_msg == "context deadline exceeded"
    await wait_until(slots_back(server), what="slot returned")


# -- shutdown --------------------------------------------------------------------------------


async def test_shutdown_does_not_requeue_a_task_that_finished_during_another_requeue(
    redis: Redis, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    release_b = asyncio.Event()
    b_returned = asyncio.Event()
    runs: list[str] = []

    async def hang(task: Task) -> None:
        runs.append(task.id or "")
        await asyncio.sleep(3600)

    async def finish_on_release(task: Task) -> None:
        runs.append(task.id or "")
        await release_b.wait()
        b_returned.set()

    mux = ServeMux()
    mux.handle("a", hang)
    mux.handle("b", finish_on_release)
    server = Server(
        redis, **{**FAST, "concurrency": 2, "shutdown_timeout": timedelta(milliseconds=200)}
    )
    await server.start(mux)
    proc = server.processor
    assert proc is not None
    a = await client.enqueue(Task("a"))
    await wait_until(lambda: a.id in proc.active, what="a running")
    b = await client.enqueue(Task("b"))
    await wait_until(lambda: b.id in proc.active, what="b running")

    requeued: list[str] = []
    requeue = server.broker.requeue

    async def requeue_while_b_finishes(msg: TaskMessage) -> None:
        requeued.append(msg.id)
        if msg.id == a.id:
            release_b.set()  # b's handler returns while a is being requeued
            await asyncio.wait_for(b_returned.wait(), 10)
        await requeue(msg)

    monkeypatch.setattr(server.broker, "requeue", requeue_while_b_finishes)
    await server.shutdown()

    assert requeued == [a.id]
    assert await list_ids(redis, keys.pending_key(Q)) == [a.id]
    assert not await redis.exists(keys.task_key(Q, b.id))
    assert runs == [a.id, b.id]


# -- burst mode ------------------------------------------------------------------------------


async def test_burst_mode_runs_a_retry_that_is_due_before_it_exits(
    redis: Redis, client: Client
) -> None:
    attempts: list[int] = []

    async def handle(task: Task) -> None:
        attempts.append(task.retry_count)
        if task.retry_count == 0:
            raise RuntimeError("first attempt fails")

    info = await client.enqueue(Task("b"))
    server = Server(
        redis,
        concurrency=2,
        burst=True,
        retry_delay=lambda n, e, t: timedelta(0),
        # Only the start-up forward runs: the retry must not depend on the forwarder.
        **fast(delayed_task_check=HOUR),
    )
    await asyncio.wait_for(server.run(one_handler("b", handle)), 90)  # a hang guard only
    assert attempts == [0, 1]
    assert not await redis.exists(keys.task_key(Q, info.id))


# -- callbacks -------------------------------------------------------------------------------


async def test_retry_delay_beyond_datetime_range_still_writes_the_retry(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    async def handle(task: Task) -> None:
        raise RuntimeError("boom")

    server = await serve(one_handler("r", handle), retry_delay=lambda n, e, t: timedelta.max)
    info = await client.enqueue(Task("r"))
    await wait_state(redis, info.id, "retry")
    score = await redis.zscore(keys.retry_key(Q), info.id)
    assert score is not None and score > time.time() + 100 * 365 * 86400
    await wait_until(slots_back(server), what="slot returned")


async def test_error_handler_raising_cancelled_error_still_writes_the_outcome(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    async def handle(task: Task) -> None:
        raise RuntimeError("boom")

    def error_handler(task: Task, exc: BaseException) -> None:
        raise asyncio.CancelledError()

    server = await serve(
        one_handler("e", handle), retry_delay=lambda n, e, t: HOUR, error_handler=error_handler
    )
    info = await client.enqueue(Task("e"))
    await wait_state(redis, info.id, "retry")
    assert (await stored_message(redis, Q, info.id)).error_msg == "RuntimeError: boom"
    await wait_until(slots_back(server), what="slot returned")


# -- recoverer -------------------------------------------------------------------------------


@pytest.mark.parametrize("named_queue", ["", "other"])
async def test_recoverer_archives_a_message_naming_another_queue_and_goes_on(
    redis: Redis, broker: Broker, serve: Callable[..., Any], named_queue: str
) -> None:
    # A message whose queue field is blank or names another queue sits in
    # "default"'s active list with an expired lease (a worker ran it but could not
    # write its outcome: every write is keyed by the queue field). It must end up
    # archived with the reason, and not stop the recovery of the tasks behind it.
    bad = message("x", queue=named_queue)
    await redis.hset(keys.task_key(Q, bad.id), mapping={"msg": bytes(bad), "state": "active"})
    await redis.lpush(keys.active_key(Q), bad.id)
    await redis.zadd(keys.lease_key(Q), {bad.id: 1})
    good = message("x")
    await broker.enqueue(good)
    assert await transitions.dequeue(broker, [Q]) is not None
    await redis.zadd(keys.lease_key(Q), {good.id: 2})  # expired after the bad one

    async def handle(task: Task) -> None:
        return None

    server = await serve(
        one_handler("x", handle),
        **fast(recoverer_cutoff=timedelta(0)),
        retry_delay=lambda n, e, t: HOUR,
    )
    await wait_state(redis, good.id, "retry")
    assert (await stored_message(redis, Q, good.id)).error_msg == "asynq: task lease expired"
    await wait_state(redis, bad.id, "archived")
    archived = await stored_message(redis, Q, bad.id)
    assert f"names queue {named_queue!r}" in archived.error_msg
    assert archived.queue == Q
    assert await list_ids(redis, keys.active_key(Q)) == []
    assert server.stats.role_restarts["recoverer"] == 0


# -- Redis outages -----------------------------------------------------------------------------


async def test_outage_longer_than_the_lease_writes_each_outcome_once() -> None:
    """Lease extension fails while Redis hangs: the handler is cancelled, nothing is
    written for that run, and once Redis is back the recoverer retries it exactly once."""
    rs = RedisServer().start()
    attempts: list[int] = []
    errors: list[BaseException] = []

    async def handle(task: Task) -> None:
        attempts.append(task.retry_count)
        if task.retry_count == 0:
            await asyncio.sleep(3600)

    try:
        opts = RedisClientOpts(host="127.0.0.1", port=rs.port, read_timeout=0.3)
        server = Server(
            opts,
            concurrency=2,
            lease_duration=timedelta(seconds=2),
            retry_delay=lambda n, e, t: timedelta(0),
            error_handler=lambda t, e: errors.append(e),
            **fast(recoverer_cutoff=timedelta(0)),
        )
        async with server:
            await server.start(one_handler("o", handle))
            async with Client(rs.url) as client:
                info = await client.enqueue(Task("o"))
            await wait_until(lambda: attempts, what="first run started")
            await asyncio.to_thread(rs.proc.send_signal, signal.SIGSTOP)  # type: ignore[union-attr]
            try:
                await wait_until(lambda: errors, what="handler cancelled by its lease")
            finally:
                await asyncio.to_thread(rs.proc.send_signal, signal.SIGCONT)  # type: ignore[union-attr]
            assert isinstance(errors[0], LeaseExpiredError)
            check = Redis.from_url(rs.url)
            try:

                async def gone() -> bool:
                    return not await check.exists(keys.task_key(Q, info.id))

                await wait_until(gone, within=20, what="task recovered, rerun and done")
                assert attempts == [0, 1]
                assert await check.get(keys.processed_total_key(Q)) == b"2"
                assert await check.get(keys.failed_total_key(Q)) == b"1"
                assert server.stats.recovered == 1
                assert not server.syncer.pending
            finally:
                await check.aclose()
    finally:
        rs.cleanup()


async def test_outcomes_left_to_a_closed_syncer_are_logged_not_kept(
    redis: Redis, serve: Callable[..., Any]
) -> None:
    async def write() -> None:
        raise ConnectionError("Redis is gone")

    async def handle(task: Task) -> None:
        return None

    with structlog.testing.capture_logs() as logs:
        server = await serve(one_handler("x", handle))
        queued = message("x")
        # Still pending when a second signal forces the shutdown: no final flush.
        server.syncer.add(write, deadline=time.time() + 60, what="done", msg=queued)
        server.force_shutdown()
        await server.wait_closed()
        # Handed over after the shutdown (a write in flight failed when the
        # connection closed): nobody will retry it.
        late = message("x")
        server.syncer.add(write, deadline=time.time() + 60, what="done", msg=late)
    assert not server.syncer.pending
    for msg in (queued, late):
        assert any(
            e["log_level"] == "error" and e.get("task_id") == msg.id and e.get("outcome") == "done"
            for e in logs
        ), f"dropped outcome of {msg.id} is logged"


# -- malformed input must not cripple a role ----------------------------------------------------


def blank_queue_of(server: Server, task_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make *task_id* reach the processor with a blank queue field. Dequeue archives such
    a stored message, so the field is blanked after it: the roles' own defences."""
    dequeue = MultiQueue.dequeue

    async def blanking(
        self: MultiQueue, qnames: list[str], count: int, **options: Any
    ) -> FetchResult:
        got = await dequeue(self, qnames, count, **options)
        for d in got.tasks:
            if d.message.id == task_id:
                d.message.queue = ""
        return got

    monkeypatch.setattr(MultiQueue, "dequeue", blanking)


async def test_blank_queue_message_does_not_stop_the_lease_extension_of_other_tasks(
    redis: Redis, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = asyncio.Event()
    started: list[str] = []

    async def handle(task: Task) -> None:
        started.append(task.id or "")
        await release.wait()

    bad, good = message("x"), message("x")
    await broker.enqueue(bad)
    await broker.enqueue(good)
    server = Server(redis, **{"concurrency": 2, **FAST})
    blank_queue_of(server, bad.id, monkeypatch)
    await server.start(one_handler("x", handle))
    try:
        await wait_until(lambda: len(started) == 2, what="both tasks running")
        first = await redis.zscore(keys.lease_key(Q), good.id)
        assert first is not None

        async def extended() -> bool:
            score = await redis.zscore(keys.lease_key(Q), good.id)
            return score is not None and score > first

        await wait_until(extended, what="lease of the good task extended")
        assert server.stats.role_restarts["heartbeater"] == 0
        release.set()
        await wait_gone(redis, good.id)
    finally:
        await server.shutdown()


async def test_undecodable_cancel_message_does_not_crash_the_subscriber(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    started = asyncio.Event()

    async def handle(task: Task) -> None:
        started.set()
        await asyncio.sleep(3600)

    server = await serve(one_handler("c", handle), retry_delay=lambda n, e, t: HOUR)
    await redis.publish(keys.CANCEL_CHANNEL, b"\xff\xfe not utf-8")
    info = await client.enqueue(Task("c"))
    await asyncio.wait_for(started.wait(), 10)
    await client.broker.publish_cancelation(info.id)
    await wait_state(redis, info.id, "retry")
    assert server.stats.role_restarts["subscriber"] == 0


@pytest.mark.parametrize("target", ["url", "redis-py client"])
async def test_a_bug_handling_a_delivery_is_logged_and_the_next_delivery_still_starts(
    redis: Redis, redis_url: str, client: Client, target: str
) -> None:
    """Delivery notes are handed over as the Pub/Sub connection reads them (from a URL,
    asyncq's own connection; through a redis-py client, the subscriber's loop): an
    exception there is logged, and neither the connection nor the subscriber dies of it."""
    ran = asyncio.Event()

    async def handle(task: Task) -> None:
        ran.set()

    calls: list[bytes] = []
    with structlog.testing.capture_logs() as logs:  # the roles' loggers are made in it
        server = Server(redis_url if target == "url" else redis, concurrency=2, **FAST)
        await server.start(one_handler("d", handle))
        subscriber = server._subscriber
        receive = subscriber._on_delivery
        assert receive is not None

        def buggy_once(note: bytes) -> None:
            calls.append(note)
            if len(calls) == 1:
                raise RuntimeError("a bug")
            receive(note)

        subscriber._on_delivery = buggy_once
        await redis.publish(keys.delivery_channel(server.server_id), b"first")
        await wait_until(lambda: calls == [b"first"], what="the first note handed over")
        await wait_until(lambda: server.processor._arming._armed_at > 0, what="armed")
        await client.enqueue(Task("d"))
        await asyncio.wait_for(ran.wait(), 10)
        await server.shutdown()
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["event"] for e in errors] == ["delivered task could not be started"]
    assert len(calls) == 2 and server.processor.stats.delivered == 1
    assert server.stats.role_restarts["subscriber"] == 0


async def test_shutdown_requeues_the_other_tasks_when_one_message_cannot_be_requeued(
    redis: Redis, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []

    async def handle(task: Task) -> None:
        started.append(task.id or "")
        await asyncio.sleep(3600)

    bad, good = message("x"), message("x")
    await broker.enqueue(bad)
    await broker.enqueue(good)
    server = Server(
        redis, **{**FAST, "concurrency": 2, "shutdown_timeout": timedelta(milliseconds=100)}
    )
    blank_queue_of(server, bad.id, monkeypatch)
    await server.start(one_handler("x", handle))
    await wait_until(lambda: len(started) == 2, what="both tasks running")
    await server.shutdown()
    assert server.state == "closed"
    assert await list_ids(redis, keys.pending_key(Q)) == [good.id]
    assert server.stats.requeued == 1


async def test_tasks_dequeued_by_a_call_whose_reply_was_lost_come_back_by_lease_recovery(
    redis: Redis, client: Client, serve: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[int] = []

    async def handle(task: Task) -> None:
        attempts.append(task.retry_count)

    dequeue = MultiQueue.dequeue
    lost: list[str] = []

    async def reply_lost(
        self: MultiQueue, qnames: list[str], count: int, **options: Any
    ) -> FetchResult:
        got = await dequeue(self, qnames, count, **options)
        if got.tasks and not lost:
            # The script ran (tasks active, leases written) but the connection died
            # before its reply arrived.
            lost.extend(d.message.id for d in got.tasks)
            raise RedisConnectionError("Connection lost (the command may or may not have run)")
        return got

    monkeypatch.setattr(MultiQueue, "dequeue", reply_lost)
    # Written before the server starts: an idle server would have it delivered, not fetched.
    info = await client.enqueue(Task("l"))
    server = await serve(
        one_handler("l", handle),
        lease_duration=timedelta(seconds=2),
        **fast(recoverer_cutoff=timedelta(0)),
        retry_delay=lambda n, e, t: timedelta(0),
    )
    await wait_until(lambda: lost, what="a dequeue reply lost")
    assert lost == [info.id]
    assert await redis.zscore(keys.lease_key(Q), info.id) is not None
    await wait_gone(redis, info.id)
    assert attempts == [1]  # never started by the lost fetch; run once after recovery
    assert server.stats.recovered == 1
    await wait_until(slots_back(server), what="slots returned")


async def test_sync_handler_past_its_timeout_fails_and_frees_its_slot(
    redis: Redis, client: Client, serve: Callable[..., Any]
) -> None:
    release = threading.Event()
    finished: list[str] = []

    def blocking(task: Task) -> None:
        release.wait(30)
        finished.append(task.id or "")

    server = await serve(
        one_handler("sync", blocking), concurrency=1, retry_delay=lambda n, e, t: HOUR
    )
    try:
        info = await client.enqueue(Task("sync"), timeout=timedelta(seconds=1))
        await wait_state(redis, info.id, "retry")
        assert (await stored_message(redis, Q, info.id)).error_msg == "context deadline exceeded"
        await wait_until(slots_back(server), what="slot returned while the thread still runs")
        assert finished == []
    finally:
        release.set()
    await wait_until(lambda: finished, what="thread finished")
    assert (await stored_message(redis, Q, info.id)).retried == 1


async def test_ack_batch_whose_reply_was_lost_is_counted_once_and_never_retried(
    redis: Redis, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = asyncio.Event()
    runs: list[str] = []

    async def handle(task: Task) -> None:
        runs.append(task.id or "")
        await release.wait()

    server = Server(redis, **{**FAST, "concurrency": 3, "retry_delay": lambda n, e, t: HOUR})
    # The syncer retries the lost batch at its next tick: in 100 ms, not asynq's 5 s
    # (set before start(): the syncer's first tick waits one interval).
    server.syncer.interval = 0.1
    async with server:
        await server.start(one_handler("a", handle))
        broker = server.broker
        ack_many = broker.ack_many
        batches: list[int] = []

        async def reply_lost(items: Any, **options: Any) -> list[Exception | None]:
            results = await ack_many(items, **options)
            batches.append(len(items))
            if len(batches) == 1:
                # Every ack of the batch landed, but the reply did not come back.
                raise RedisConnectionError("Connection lost (the command may or may not have run)")
            return results

        monkeypatch.setattr(broker, "ack_many", reply_lost)
        infos = [await client.enqueue(Task("a")) for _ in range(3)]
        await wait_until(lambda: len(runs) == 3, what="three handlers running")
        release.set()  # all three return in the same turn: one batch
        for info in infos:
            await wait_gone(redis, info.id)
        await wait_until(lambda: batches and not server.syncer.pending, what="syncer done")
        assert batches[0] == 3
        assert await redis.get(keys.processed_total_key(Q)) == b"3"
        assert await redis.get(keys.failed_total_key(Q)) is None
        assert await redis.zcard(keys.retry_key(Q)) == 0
        assert sorted(runs) == sorted(i.id for i in infos)
        await wait_until(slots_back(server), what="slots returned")


async def test_cancel_message_during_the_write_phase_changes_nothing(
    redis: Redis, client: Client, serve: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def handle(task: Task) -> None:
        return None

    server = await serve(one_handler("w", handle), retry_delay=lambda n, e, t: HOUR)
    proc = server.processor
    assert proc is not None
    broker = server.broker
    ack_many = broker.ack_many
    in_write = asyncio.Event()
    go_on = asyncio.Event()

    async def slow_ack(items: Any, **options: Any) -> list[Exception | None]:
        in_write.set()
        await go_on.wait()
        return await ack_many(items, **options)

    monkeypatch.setattr(broker, "ack_many", slow_ack)
    info = await client.enqueue(Task("w"))
    await asyncio.wait_for(in_write.wait(), 10)
    # What the subscriber calls for a cancel message:
    assert proc.active.cancel(info.id, TaskCanceledError()) is None
    await client.broker.publish_cancelation(info.id)
    go_on.set()
    await wait_gone(redis, info.id)
    assert await redis.get(keys.processed_total_key(Q)) == b"1"
    assert await redis.get(keys.failed_total_key(Q)) is None
    assert server.stats.failed == 0
