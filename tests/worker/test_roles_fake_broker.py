"""Each worker role alone, on the in-memory broker of tests/support/fakebroker.py (no Redis).

The failure paths the Redis tests can only reach with a killed server or a
patched method: a write that fails, a lease lost mid-handler, a cancel racing
completion, shutdown while a write is in flight, a broker that is down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import anyio
import pytest
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncq import Aggregation, Intervals, Limits
from asyncq._broker import DequeuedTask
from asyncq._broker.durable import RUN_HEADER, RUN_QUEUE_HEADER, STEP_HEADER
from asyncq._worker import active as active_module
from asyncq._worker.active import ActiveTask, ActiveTasks
from asyncq._worker.aggregator import GroupAggregatorRole
from asyncq._worker.forwarder import Forwarder
from asyncq._worker.heartbeater import Heartbeater, ServerIdentity
from asyncq._worker.janitor import Janitor
from asyncq._worker.lease import Lease
from asyncq._worker.processor import Processor
from asyncq._worker.queuewatcher import QueueWatcher
from asyncq._worker.recoverer import Recoverer
from asyncq._worker.syncer import Syncer
from asyncq.errors import (
    LeaseExpiredError,
    TaskCanceledError,
    TaskNotFoundError,
)
from asyncq.hooks import NoWorkerHooks
from asyncq.mux import ServeMux
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task, TaskInfo
from tests.support.fakebroker import FakeBroker
from tests.support.helpers import wait_until
from tests.support.roles import (
    Q,
    Running,
    _exits,
    _fails,
    _rate_limited,
    _returns,
    _revokes,
    _skips,
    message,
    role_deps,
)

# -- processor -----------------------------------------------------------------------------------


async def test_processor_acknowledges_successes_in_one_call() -> None:
    fake = FakeBroker()
    ids = [fake.enqueue(message()).id for _ in range(3)]
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")

    async with Running(fake, handler, concurrency=5) as run:
        await wait_until(lambda: not fake.tasks, what="all acknowledged")
    assert sorted(ran) == sorted(ids)
    assert fake.processed == 3
    assert [sorted(i for i, _ in batch) for batch in fake.called("ack_many")] == [sorted(ids)]
    assert run.processor.stats.succeeded == 3
    assert not run.deferred.writes


async def test_processor_hands_a_failed_outcome_write_to_the_syncer() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    fake.fail("retry")

    async def handler(task: Task) -> None:
        raise ValueError("boom")

    async with Running(fake, handler) as run:
        await wait_until(lambda: run.deferred.writes, what="write deferred")
        assert fake.state(msg.id) == "active"  # nothing written yet
        ((what, write),) = run.deferred.writes
        assert what == "retry"
        await write()  # what the syncer does once Redis answers again
    stored = fake.tasks[msg.id]
    assert (stored.state, stored.msg.retried, stored.error) == ("retry", 1, "ValueError: boom")


async def test_processor_hands_a_failed_acknowledgement_to_the_syncer() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    fake.fail("ack_many")

    async def handler(task: Task) -> None:
        return None

    async with Running(fake, handler) as run:
        await wait_until(lambda: run.deferred.writes, what="write deferred")
        ((what, write),) = run.deferred.writes
        assert what == "done"
        await write()
    assert msg.id not in fake.tasks
    assert fake.called("done") == [msg.id]


async def test_processor_writes_nothing_when_the_lease_is_lost_mid_handler() -> None:
    fake = FakeBroker(lease_duration=30)
    msg = fake.enqueue(message())
    started = asyncio.Event()
    cancelled: list[BaseException] = []

    async def handler(task: Task) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            cancelled.append(exc)
            raise

    async with Running(fake, handler) as run:
        await asyncio.wait_for(started.wait(), 5)
        beat = Heartbeater(
            run.deps,
            5.0,
            active=run.active,
            identity=ServerIdentity("h", 1, "s"),
            status=lambda: "active",
            started_at=lambda: None,
        )
        fake.advance(31)  # past the local lease: the next beat declares it expired
        await beat.tick()
        await wait_until(lambda: not run.active, what="handler cancelled and released")
    assert cancelled
    assert run.processor.stats.failed == 1
    assert fake.state(msg.id) == "active"  # left to the recoverer
    assert not fake.called("retry") and not fake.called("archive")
    assert fake.called("extend_lease") == []  # an expired lease is never extended


async def test_a_cancel_arriving_while_the_success_is_written_changes_nothing() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    ack = fake.hold("ack_many")

    async def handler(task: Task) -> None:
        return None

    async with Running(fake, handler) as run:
        await asyncio.wait_for(ack.arrived.wait(), 5)
        # The handler has returned and its acknowledgement is in flight.
        assert run.active.cancel(msg.id, TaskCanceledError()) is None
        ack.release.set()
        await wait_until(lambda: msg.id not in fake.tasks, what="acknowledged")
    assert run.processor.stats.succeeded == 1 and run.processor.stats.failed == 0
    assert not fake.called("retry")


async def test_a_cancel_before_the_handler_returns_is_a_retried_failure() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    started = asyncio.Event()

    async def handler(task: Task) -> None:
        started.set()
        await asyncio.sleep(3600)

    async with Running(fake, handler) as run:
        await asyncio.wait_for(started.wait(), 5)
        assert run.active.cancel(msg.id, TaskCanceledError()) is not None
        await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
    assert fake.tasks[msg.id].msg.retried == 1


async def test_cleanup_awaiting_after_a_cancel_finishes_in_the_handlers_own_task() -> None:
    """A handler's cleanup may await after its cancellation (an HTTP client closing its
    connection in an anyio shielded scope): it is not ignoring the cancellation, and
    anyio requires a scope to be left in the task it was entered in."""
    fake = FakeBroker()
    msg = fake.enqueue(message())
    started = asyncio.Event()
    cleaned: list[bool] = []

    async def handler(task: Task) -> None:
        with anyio.CancelScope():
            try:
                started.set()
                await asyncio.sleep(3600)
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(0.05)
                    cleaned.append(True)

    async with Running(fake, handler) as run:
        await asyncio.wait_for(started.wait(), 5)
        assert run.active.cancel(msg.id, TaskCanceledError()) is not None
        await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
        assert not run.processor.orphans
    assert cleaned == [True]
    assert fake.tasks[msg.id].error == str(TaskCanceledError())


async def test_a_timeout_inside_the_handler_is_the_handlers_own() -> None:
    """``asyncio.timeout`` cancels the handler's task too; caught by the handler, it is not
    a stop request, and the handler runs on to its result."""
    fake = FakeBroker()
    msg = fake.enqueue(message())
    steps: list[str] = []

    async def handler(task: Task) -> None:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(3600)
        except TimeoutError:
            steps.append("timed out")
        await asyncio.sleep(0.01)
        steps.append("went on")

    async with Running(fake, handler) as run:
        await wait_until(lambda: msg.id not in fake.tasks, what="acknowledged")
        assert not run.processor.orphans
    assert steps == ["timed out", "went on"]


async def test_shutdown_waits_for_an_acknowledgement_in_flight() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    ack = fake.hold("ack_many")

    async def handler(task: Task) -> None:
        return None

    run = Running(fake, handler)
    async with run:
        await asyncio.wait_for(ack.arrived.wait(), 5)
        drain = asyncio.create_task(run.processor.drain(1.0))
        await asyncio.sleep(0.05)
        assert not drain.done()  # the slot is held until the outcome is written
        ack.release.set()
        await asyncio.wait_for(drain, 5)
    assert msg.id not in fake.tasks
    assert not fake.called("requeue")


async def test_shutdown_requeues_what_still_runs_after_the_grace() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    started = asyncio.Event()

    async def handler(task: Task) -> None:
        started.set()
        await asyncio.sleep(3600)

    run = Running(fake, handler)
    async with run:
        await asyncio.wait_for(started.wait(), 5)
        await run.processor.drain(0.05)
    assert fake.called("requeue") == [msg.id]
    assert fake.state(msg.id) == "pending" and fake.pending[Q] == [msg.id]
    assert run.processor.stats.requeued == 1


async def test_processor_survives_a_broker_that_is_down() -> None:
    fake = FakeBroker()
    fake.down()
    msg = fake.enqueue(message())

    async def handler(task: Task) -> None:
        return None

    async with Running(fake, handler) as run:
        await wait_until(lambda: run.processor.stats.fetch_errors >= 2, what="fetches failed")
        fake.up()
        await wait_until(lambda: msg.id not in fake.tasks, what="processed once up")


# -- the per-task coroutine -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("handler", "fields", "state", "retried", "failed"),
    [
        (_returns, {}, None, 0, 0),
        (_returns, {"retention": 60}, "completed", 0, 0),
        (_fails, {}, "retry", 1, 1),
        (_fails, {"retried": 3}, "archived", 3, 1),
        (_skips, {}, "archived", 0, 1),
        (_revokes, {}, None, 0, 0),
        (_rate_limited, {}, "retry", 0, 0),
        (_exits, {}, "retry", 1, 1),
    ],
)
async def test_each_outcome_of_a_task_is_written_and_its_slot_freed(
    handler: Callable[[Task], Coroutine[Any, Any, None]],
    fields: dict[str, Any],
    state: str | None,
    retried: int,
    failed: int,
) -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message(**fields))
    async with Running(fake, handler, concurrency=2) as run:
        await wait_until(
            lambda: fake.state(msg.id) not in ("pending", "active") and not run.active,
            what="written",
        )
        assert fake.state(msg.id) == state
        assert run.processor.slots.free == 2
    if state is not None:
        assert fake.tasks[msg.id].msg.retried == retried
    assert run.processor.stats.failed == failed
    assert not run.processor.orphans


async def test_a_plain_def_handler_raising_generator_exit_is_a_failure() -> None:
    # Raised in the worker thread, it reaches the task's coroutine thrown in by the event
    # loop, which closes what the coroutine awaits (PEP 380) instead of throwing it there.
    fake = FakeBroker()
    msg = fake.enqueue(message())
    mux = ServeMux()

    @mux.handler("t")
    def poison(task: Task) -> None:
        raise GeneratorExit

    async with Running(fake, mux) as run:
        await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
        await wait_until(lambda: not run.active, what="slot freed")
    assert fake.tasks[msg.id].error == "GeneratorExit"


async def test_a_handler_swallowing_its_cancellation_is_orphaned_and_shutdown_leaves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(active_module, "CANCEL_GRACE", 0.1)
    fake = FakeBroker()
    msg = fake.enqueue(message(timeout=1))
    resume = asyncio.Event()
    returned: list[str] = []

    async def stubborn(task: Task) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # swallowed: goes on working
            await asyncio.sleep(3600)
        await resume.wait()
        returned.append(task.id or "")

    with structlog.testing.capture_logs() as logs:
        async with Running(fake, stubborn, concurrency=1) as run:
            await wait_until(lambda: fake.state(msg.id) == "retry", what="failure written")
            stored = fake.tasks[msg.id]
            assert (stored.msg.retried, stored.error) == (1, "context deadline exceeded")
            await wait_until(lambda: run.processor.slots.free == 1, what="slot freed")
            (orphan,) = run.processor.orphans
            assert not orphan.done() and not run.active
            # Shutdown does not wait for it (the context manager drains, then awaits the loop).
        assert not orphan.done()
        resume.set()
        await asyncio.wait_for(orphan, 5)
    assert returned == [msg.id]
    assert not run.processor.orphans
    assert fake.tasks[msg.id].msg.retried == 1  # its late return wrote nothing
    assert [e["event"] for e in logs if e["log_level"] == "error"] == [
        "handler ignored its cancellation; freeing its slot (the handler goes on in the "
        "background, its return writes nothing)"
    ]


async def test_shutdown_leaves_an_abandoned_handler_that_ignores_its_cancellation() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    started = asyncio.Event()
    resume = asyncio.Event()

    async def stubborn(task: Task) -> None:
        started.set()
        while not resume.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await resume.wait()

    with structlog.testing.capture_logs() as logs:
        run = Running(fake, stubborn)
        async with run:
            await asyncio.wait_for(started.wait(), 5)
            await asyncio.wait_for(run.processor.drain(0.05), 5)
            assert len(run.processor.orphans) == 1
    assert fake.called("requeue") == [msg.id]
    assert fake.state(msg.id) == "pending"
    assert any(e["event"] == "handlers ignored cancellation; leaving them" for e in logs)
    resume.set()
    await wait_until(lambda: not run.processor.orphans, what="orphan returned")
    assert fake.state(msg.id) == "pending"  # nothing written for an abandoned task


async def test_a_cancel_landing_in_the_turn_the_handler_would_return_wins() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    waiting = asyncio.Event()
    gate = asyncio.Event()

    async def handler(task: Task) -> None:
        waiting.set()
        await gate.wait()

    async with Running(fake, handler) as run:
        await asyncio.wait_for(waiting.wait(), 5)
        gate.set()  # the handler would return at its next step...
        assert run.active.cancel(msg.id, TaskCanceledError()) is not None  # ...the cancel is first
        await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
    assert fake.tasks[msg.id].error == "context canceled"
    assert run.processor.stats.succeeded == 0


async def test_a_cancel_after_the_handler_returned_changes_nothing() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    cancels: list[object] = []

    async def handler(task: Task) -> None:
        # Scheduled now, run after the handler returned, before the write resumes.
        asyncio.get_running_loop().call_soon(
            lambda: cancels.append(run.active.cancel(msg.id, TaskCanceledError()))
        )

    async with Running(fake, handler) as run:
        await wait_until(lambda: msg.id not in fake.tasks, what="acknowledged")
    assert cancels == [None]
    assert run.processor.stats.succeeded == 1 and not fake.called("retry")


async def test_a_cancel_before_the_tasks_coroutine_started_fails_it_unrun() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")

    run = Running(fake, handler)
    start = run.processor._start

    def start_then_cancel(got: DequeuedTask) -> None:
        start(got)
        assert run.active.cancel(got.message.id, TaskCanceledError()) is not None

    run.processor._start = start_then_cancel  # type: ignore[method-assign]
    async with run:
        await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
        await wait_until(lambda: run.processor.slots.free == run.processor.slots.capacity,
                         what="slot freed")  # fmt: skip
    assert ran == []


async def test_a_lease_lost_while_the_handler_swallows_it_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(active_module, "CANCEL_GRACE", 0.1)
    fake = FakeBroker(lease_duration=30)
    msg = fake.enqueue(message())
    started = asyncio.Event()

    async def handler(task: Task) -> None:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        # returns normally, after the lease was lost

    async with Running(fake, handler) as run:
        await asyncio.wait_for(started.wait(), 5)
        fake.advance(31)
        run.active[msg.id].lease.expire()
        await wait_until(lambda: not run.active, what="released")
    assert fake.state(msg.id) == "active"  # left to the recoverer
    assert not fake.called("ack_many") and not fake.called("retry")
    assert run.processor.stats.failed == 1


# -- heartbeater ---------------------------------------------------------------------------------


async def test_heartbeater_extends_live_leases_and_survives_a_failed_extension() -> None:
    fake = FakeBroker(lease_duration=30)
    started = asyncio.Event()

    async def handler(task: Task) -> None:
        started.set()
        await asyncio.sleep(3600)

    msg = fake.enqueue(message())
    async with Running(fake, handler) as run:
        await asyncio.wait_for(started.wait(), 5)
        beat = Heartbeater(
            run.deps,
            5.0,
            active=run.active,
            identity=ServerIdentity("h", 1, "s1"),
            status=lambda: "active",
            started_at=lambda: None,
        )
        fake.advance(10)
        fake.fail("extend_lease")
        await beat.tick()  # logged, not raised; the server state is still written
        assert fake.servers["s1"][1][0].task_id == msg.id
        assert run.active[msg.id].lease.valid()
        await beat.tick()
        assert fake.leases[msg.id] == int(fake.now + 30)
        assert run.active[msg.id].lease.expires_at == int(fake.now + 30)
        await beat.cleanup()
        assert "s1" not in fake.servers


# -- recoverer -----------------------------------------------------------------------------------


async def test_recoverer_retries_now_archives_exhausted_and_forwards_at_once() -> None:
    fake = FakeBroker(lease_duration=30)
    alive = fake.enqueue(message())
    exhausted = fake.enqueue(message(retried=3))
    await fake.fetch([Q], 2)  # a worker took them, then died
    wakeup = asyncio.Event()
    deps = role_deps(fake)
    rec = Recoverer(deps, 60.0, active=ActiveTasks(), wakeup=wakeup)
    fake.advance(31)  # expired 1 s ago: within the 2 s cutoff
    await rec.tick()
    assert fake.state(alive.id) == "active" and not wakeup.is_set()
    fake.advance(2)
    await rec.tick()
    ((tid, retry_at, err, is_failure),) = fake.called("retry")
    assert (tid, err, is_failure) == (alive.id, "asynq: task lease expired", True)
    assert retry_at <= fake.now  # an expired lease is retried at once by default
    assert fake.state(alive.id) == "pending"  # and forwarded by the recoverer itself
    assert fake.tasks[alive.id].msg.retried == 1
    assert fake.state(exhausted.id) == "archived"
    assert wakeup.is_set()
    assert deps.stats.recovered == 2


async def test_recoverer_wakes_at_the_earliest_lease_expiry_plus_the_cutoff() -> None:
    fake = FakeBroker(lease_duration=30)
    deps = role_deps(fake, intervals=Intervals(recoverer_cutoff=timedelta(seconds=2)))
    rec = Recoverer(deps, 60.0, active=ActiveTasks())
    await rec.tick()
    assert rec.next_wait == 30  # nothing active: at least once per lease duration
    fake.enqueue(message())
    await fake.fetch([Q], 1)  # lease = now + 30
    fake.advance(12)
    await rec.tick()
    assert rec.next_wait == pytest.approx(30 - 12 + 2)


async def test_recoverer_leaves_a_task_running_here_and_checks_again_soon() -> None:
    fake = FakeBroker(lease_duration=30)
    fake.enqueue(message())
    (got,) = (await fake.fetch([Q], 1)).tasks
    active = ActiveTasks()
    fake.advance(40)
    # Running here with a valid local lease: its extension has not reached Redis yet.
    lease = Lease(fake.now + 20, clock=fake.clock)
    active[got.message.id] = ActiveTask(got.message, lease, fake.now + 60, fake.now)
    rec = Recoverer(role_deps(fake), 60.0, active=active)
    await rec.tick()
    assert not fake.called("retry")
    assert rec.next_wait == 1.0


async def test_recoverer_losing_a_race_and_a_broker_down() -> None:
    fake = FakeBroker(lease_duration=30)
    fake.enqueue(message())
    await fake.fetch([Q], 1)
    deps = role_deps(fake)
    rec = Recoverer(deps, 60.0, active=ActiveTasks())
    fake.advance(40)
    fake.fail("retry", TaskNotFoundError(Q, "x"))  # another server recovered it first
    await rec.tick()
    assert deps.stats.recovered == 0
    fake.down()
    with pytest.raises(RedisConnectionError):
        await rec.tick()  # left to run(), which logs it and checks again later


# -- forwarder, janitor, syncer, queue watcher --------------------------------------------------


async def test_forwarder_moves_due_tasks_and_wakes_the_processor() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    await fake.fetch([Q], 1)
    await fake.retry(msg, datetime.fromtimestamp(fake.now + 10, UTC), "e", is_failure=True)
    wakeup = asyncio.Event()
    fwd = Forwarder(role_deps(fake), 5.0, wakeup=wakeup)
    await fwd.tick()
    assert fake.state(msg.id) == "retry" and not wakeup.is_set()
    fake.advance(10)
    await fwd.tick()
    assert fake.state(msg.id) == "pending" and wakeup.is_set()


async def test_janitor_deletes_completed_tasks_past_their_retention() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message(retention=60))
    await fake.fetch([Q], 1)
    await fake.mark_as_complete(msg)
    deps = role_deps(fake)
    janitor = Janitor(deps, 8.0)
    await janitor.tick()
    assert fake.state(msg.id) == "completed"
    fake.advance(61)
    await janitor.tick()
    assert msg.id not in fake.tasks and deps.stats.janitor_deleted == 1


async def test_syncer_retries_until_the_lease_deadline_then_drops() -> None:
    fake = FakeBroker()
    kept = fake.enqueue(message())
    dropped = fake.enqueue(message())
    await fake.fetch([Q], 2)
    syncer = Syncer(role_deps(fake), 5.0)
    fake.down()

    def done(msg: TaskMessage) -> Callable[[], Awaitable[None]]:
        return lambda: fake.done(msg)

    syncer.add(done(kept), deadline=fake.now + 30, what="done", msg=kept)
    syncer.add(done(dropped), deadline=fake.now + 5, what="done", msg=dropped)
    await syncer.flush()
    assert len(syncer.pending) == 2
    fake.up()
    fake.advance(10)
    await syncer.flush()
    assert not syncer.pending
    assert kept.id not in fake.tasks  # written once Redis answered
    assert fake.state(dropped.id) == "active"  # past its lease: left to the recoverer


async def test_queue_watcher_serves_new_matches_and_marks_ordered_ones() -> None:
    fake = FakeBroker()
    fake.queues |= {"tenant:a", "other"}
    deps = role_deps(fake, queues={"tenant:*": 1})
    wakeup = asyncio.Event()
    watcher = QueueWatcher(deps, 1.0, wakeup=wakeup, ordered=["tenant:*"])
    await watcher.tick()
    assert deps.queues.names() == ["tenant:a"]
    assert fake.ordered == {"tenant:a"} and wakeup.is_set()


# -- aggregator ----------------------------------------------------------------------------------


async def test_aggregator_enqueues_the_aggregate_and_keeps_the_set_when_that_fails() -> None:
    fake = FakeBroker()
    for i in range(2):
        fake.add_to_group(message(payload=b"%d" % i, id=f"g{i}"), "grp")
    enqueued: list[Task] = []
    failing = [True]

    async def enqueue(task: Task, queue: str) -> TaskInfo:
        if failing[0]:
            raise RedisConnectionError("down")
        enqueued.append(task)
        msg = TaskMessage(id="agg", type=task.type, queue=queue)
        return TaskInfo.from_message(msg, "pending", None)

    def aggregate(group: str, tasks: list[Task]) -> Task:
        return Task("joined", b",".join(t.payload or b"" for t in tasks))

    deps = role_deps(
        fake,
        aggregation=Aggregation(aggregator=aggregate, grace_period=timedelta(seconds=1)),
    )
    role = GroupAggregatorRole(deps, 1.0, enqueue=enqueue)
    fake.advance(2)
    await role._check(datetime.fromtimestamp(fake.clock(), UTC))  # one tick's check
    assert deps.stats.aggregation_errors == 1
    assert len(fake.sets) == 1  # staged, reclaimed later by the recoverer
    failing[0] = False
    ((q, g, set_id),) = fake.sets
    await role._aggregate(q, g, set_id)
    assert [t.payload for t in enqueued] == [b"0,1"]
    assert not fake.sets and deps.stats.aggregated == 1


async def test_syncer_finish_flushes_unless_the_shutdown_is_forced() -> None:
    fake = FakeBroker()
    first = fake.enqueue(message())
    second = fake.enqueue(message())
    await fake.fetch([Q], 2)
    for forced, msg in ((False, first), (True, second)):
        syncer = Syncer(role_deps(fake), 5.0)
        syncer.add(partial(fake.done, msg), deadline=fake.now + 30, what="done", msg=msg)
        await syncer.finish(forced=forced)
        assert not syncer.pending
    assert first.id not in fake.tasks  # flushed at a graceful shutdown
    assert fake.state(second.id) == "active"  # dropped: left to the recoverer
    assert fake.called("done") == [first.id]


def test_every_role_has_a_place_in_the_shutdown_order() -> None:
    from asyncq._worker.healthchecker import HealthChecker
    from asyncq._worker.history_flusher import HistoryFlusher
    from asyncq._worker.server import SHUTDOWN_ORDER
    from asyncq._worker.subscriber import Subscriber
    from asyncq._worker.watchdog import Watchdog

    roles = [
        Processor, Heartbeater, Watchdog, Forwarder, Recoverer, Janitor, Syncer,
        Subscriber, HealthChecker, QueueWatcher, GroupAggregatorRole, HistoryFlusher,
    ]  # fmt: skip
    assert sorted(r.name for r in roles) == sorted(SHUTDOWN_ORDER)


async def test_a_failed_type_rate_token_call_puts_the_task_back_unrun() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message("api"))
    fake.fail("take_type_tokens")
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")

    async with Running(fake, handler, limits=Limits(type_rate_limits={"api": "10/s"})) as run:
        await wait_until(lambda: fake.state(msg.id) == "retry", what="rescheduled")
    assert ran == []
    ((_, retry_at, _, is_failure),) = fake.called("retry")
    assert retry_at == fake.now + 1 and is_failure is False  # no retry used, in a second
    assert fake.tasks[msg.id].msg.retried == 0
    assert run.processor.stats.type_rate_limited == 1


def step_headers(member: int) -> dict[str, str]:
    from asyncq._broker.workflow import (
        WORKFLOW_HEADER,
        WORKFLOW_QUEUE_HEADER,
        WORKFLOW_STEP_HEADER,
    )

    return {WORKFLOW_HEADER: "wf", WORKFLOW_QUEUE_HEADER: Q, WORKFLOW_STEP_HEADER: f"0.{member}"}


async def test_a_workflow_step_is_acknowledged_with_its_hand_off() -> None:
    fake = FakeBroker()
    ok = [fake.enqueue(message(headers=step_headers(j))) for j in range(3)]
    kept = fake.enqueue(message(headers=step_headers(3), retention=60))
    plain = fake.enqueue(message())
    bad = fake.enqueue(message("bad", headers=step_headers(4), retried=3))

    async def handler(task: Task) -> None:
        if task.type == "bad":
            raise ValueError("no")

    async with Running(fake, handler):
        await wait_until(lambda: not fake.tasks.keys() - {kept.id, bad.id}, what="acked")
        await wait_until(lambda: fake.called("ack_workflow_step"), what="archived")
    # Successes, the steps' among them, share the batched acknowledgement (the
    # broker records each step in its workflow there); a failed step alone.
    acked = sorted(i for batch in fake.called("ack_many") for i in batch)
    want = [(m.id, False) for m in (*ok, plain)] + [(kept.id, True)]
    assert acked == sorted(want)
    steps = [(m.id, "done") for m in ok] + [(kept.id, "complete"), (bad.id, "archive")]
    assert sorted(fake.workflow_steps) == sorted(steps)
    assert len(fake.called("ack_many")) < len(want)  # several in one call
    assert fake.called("ack_workflow_step") == [(bad.id, "archive")]
    assert not fake.called("archive") and not fake.called("done")


async def test_a_failed_batched_step_acknowledgement_is_retried_as_the_steps_own() -> None:
    fake = FakeBroker()
    step = fake.enqueue(message(headers=step_headers(0)))
    plain = fake.enqueue(message())
    fake.fail("ack_many")  # the connection drops with the batch: nothing was written

    async def handler(task: Task) -> None:
        return None

    async with Running(fake, handler) as run:
        await wait_until(lambda: len(run.deferred.writes) == 2, what="writes deferred")
        for what, write in run.deferred.writes:
            assert what == "done"
            await write()  # what the syncer does once Redis answers again
    assert fake.called("ack_workflow_step") == [(step.id, "done")]
    assert fake.called("done") == [plain.id]
    assert fake.workflow_steps == [(step.id, "done")]  # recorded once, with its hand-off
    assert not fake.tasks and fake.processed == 2


async def test_a_failed_batched_durable_step_acknowledgement_is_retried_as_the_steps_own() -> None:
    fake = FakeBroker()
    headers = {RUN_HEADER: "r1", RUN_QUEUE_HEADER: "default", STEP_HEADER: "0"}
    step = fake.enqueue(message(id="r1-0", headers=headers))
    fake.fail("ack_many")  # the connection drops with the batch: nothing was written

    async def handler(task: Task) -> None:
        return None

    async with Running(fake, handler) as run:
        await wait_until(lambda: len(run.deferred.writes) == 1, what="write deferred")
        for what, write in run.deferred.writes:
            assert what == "done"
            await write()  # what the syncer does once Redis answers again
    assert fake.called("ack_durable_step") == [(step.id, "done")]
    assert fake.durable_steps == [(step.id, "done")]  # recorded once, with its run
    assert not fake.tasks and fake.processed == 1


class _Finished(NoWorkerHooks):
    """Records task_finished calls (the event stream and the metrics observe these)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, str, str, type[BaseException] | None]] = []

    def task_finished(
        self,
        queue: str,
        task_type: str,
        task_id: str,
        outcome: str,
        *,
        error: str,
        exc: BaseException | None,
    ) -> None:
        self.calls.append(
            (queue, task_type, task_id, outcome, error, None if exc is None else type(exc))
        )


async def test_recoverer_tells_its_hooks_of_each_task_it_retries_or_archives() -> None:
    # A dead worker's tasks show in the event stream and the metrics as the processor's
    # own outcomes do: failed with the lease error, then retried or archived.
    fake = FakeBroker(lease_duration=30)
    alive = fake.enqueue(message())
    exhausted = fake.enqueue(message(retried=3))
    await fake.fetch([Q], 2)
    hooks = _Finished()
    rec = Recoverer(role_deps(fake), 60.0, active=ActiveTasks(), hooks=hooks)
    fake.advance(33)
    await rec.tick()
    err = "asynq: task lease expired"
    assert sorted(hooks.calls) == sorted(
        [
            (Q, alive.type, alive.id, "retry", err, LeaseExpiredError),
            (Q, exhausted.type, exhausted.id, "archive", err, LeaseExpiredError),
        ]
    )
    # A task another recoverer moved first is not reported twice.
    await rec.tick()
    assert len(hooks.calls) == 2
