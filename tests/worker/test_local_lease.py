"""The worker's local lease of a fetched task, on the fake broker of tests/support/fakebroker.py.

Redis stores a lease's expiry in whole seconds, truncated (asynq's ``ZADD`` of a unix
second); a fetch made at a fractional time hands the processor the exact expiry. The
local lease must end at the second Redis holds, never after it: between the two, the
recoverer may already have given the task to another worker.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from structlog.testing import capture_logs

from asyncq._worker.active import ActiveTask, ActiveTasks, AttemptPhase
from asyncq._worker.lease import Lease
from asyncq._worker.watchdog import Watchdog
from asyncq.task import Task
from tests.support.fakebroker import FakeBroker
from tests.support.helpers import wait_until
from tests.support.roles import Running, message, role_deps


async def test_a_task_finishing_past_the_truncated_lease_writes_nothing() -> None:
    fake = FakeBroker(now=1_700_000_000.5, lease_duration=30)  # fetch expiry: ...030.5
    msg = fake.enqueue(message())
    started = asyncio.Event()
    finish = asyncio.Event()

    async def handler(task: Task) -> None:
        started.set()
        await finish.wait()

    with capture_logs() as logs:
        async with Running(fake, handler) as run:
            await asyncio.wait_for(started.wait(), 10)
            assert fake.leases[msg.id] == 1_700_000_030  # what Redis holds
            assert run.active[msg.id].lease.expires_at == 1_700_000_030
            # Past Redis's lease, within the fetch's fractional second: the recoverer may
            # have taken the task, so the handler's success must not be written.
            fake.advance(29.8)
            finish.set()
            await wait_until(lambda: not run.active, what="the handler released")
    assert fake.state(msg.id) == "active"  # left to the recoverer
    assert not fake.called("ack_many") and not fake.called("done")
    assert not run.deferred.writes
    assert "task finished after its lease expired" in " ".join(e["event"] for e in logs)


async def test_a_task_whose_lease_ran_out_before_its_first_step_is_not_run() -> None:
    """A stall between a fetch and a task's first step (another handler blocking the loop)
    can outlast the lease: the recoverer may have given the task to another server, so
    its handler must not start here, or it runs twice (seen in the chaos suite's poison
    pills under load)."""
    fake = FakeBroker(lease_duration=30)
    msgs = [fake.enqueue(message()), fake.enqueue(message())]
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")
        if len(ran) == 1:
            fake.advance(31)  # blocks the loop past every lease fetched with this task

    with capture_logs() as logs:
        async with Running(fake, handler, concurrency=2) as run:
            await wait_until(
                lambda: bool(ran) and not run.active,
                what="both tasks released",
            )
    assert len(ran) == 1  # the second handler never started
    assert {fake.state(m.id) for m in msgs} == {"active"}  # both left to the recoverer
    assert not fake.called("ack_many") and not fake.called("done")
    assert not fake.called("retry") and not fake.called("archive")
    events = [e["event"] for e in logs]
    assert "task lease expired; handler cancelled" in events
    assert run.processor.stats.failed == 1


@pytest.mark.parametrize("state", ["starting", "running", "writing"])
async def test_the_watchdog_keeps_every_lease_the_stall_holds(state: AttemptPhase) -> None:
    """While the loop is blocked, a fetched task whose coroutine has not run yet and an
    outcome being written are held by the stall as much as a running handler: their
    leases are kept too (as the heartbeater keeps them), or another server re-runs them."""
    fake = FakeBroker(now=time.time(), lease_duration=30)  # the watchdog reads the real clock
    msg = fake.enqueue(message())
    fake.leases[msg.id] = fake.now + 5
    active = ActiveTasks()
    act = ActiveTask(msg, Lease(fake.now + 5, clock=fake.clock), fake.now + 60, fake.now)
    act.state = state
    active[msg.id] = act
    dog = Watchdog(
        role_deps(fake), active=active, threshold=1.0, keep_leases_with=None, on_stall=print
    )
    await dog._keep_leases(fake)  # type: ignore[arg-type]
    assert fake.called("extend_lease") == [(msg.queue, [msg.id])]
    assert act.lease.expires_at == int(fake.now + 30)
