"""One door for every task: a delivered task starts exactly as a fetched one, and a delivery
that arrives while the processor stops is requeued, never started, never lost.

On the fake broker. The delivery side's own cases (arming, no slot, unreadable notes) are in
test_delivery_processor.py.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from asyncq.mux import sync_threads
from asyncq.task import Task
from tests.support.fakebroker import FakeBroker
from tests.support.helpers import wait_until
from tests.support.roles import SERVER, Armed, Q, message


@pytest.mark.parametrize("door", ["fetched", "delivered"])
async def test_a_delivered_task_starts_by_the_fetched_tasks_door(door: str) -> None:
    fake = FakeBroker()
    fake.now = 1_700_000_000.75  # a lease expiry with a fraction: floored by the start
    seen: dict[str, Any] = {}
    release = asyncio.Event()

    async def handler(task: Task) -> None:
        active = run.active[task.id or ""]
        seen.update(
            lease=active.lease.expires_at,
            deadline=active.deadline,
            task_deadline=task._deadline_ts,
            threads=sync_threads.get(None),
            inflight=run.processor._inflight_bytes,
            free=run.processor.slots.free,
        )
        await release.wait()

    run = Armed(fake, handler, concurrency=2)
    async with run:
        await wait_until(lambda: fake.credits.get(SERVER) == 1, what="armed")
        msg = message(payload=b"12345", timeout=60)
        if door == "fetched":
            fake.enqueue(msg)
            run.wakeup.set()
        else:
            run.deliver(id="t-delivered", payload=b"12345", timeout=60)
        await wait_until(lambda: seen, what="the handler")
        # The same start: the lease floored to Redis's whole seconds, the deadline from
        # the start time, the processor's context, the bytes and the slot counted.
        assert seen["lease"] == math.floor(fake.now + fake.lease_duration)
        assert seen["deadline"] == fake.now + 60
        assert seen["task_deadline"] == seen["deadline"]
        assert seen["threads"] is run.processor._threads
        assert seen["inflight"] == 5
        assert seen["free"] == 1
        release.set()
        await wait_until(lambda: fake.processed == 1, what="acknowledged")
        await wait_until(lambda: not run.active, what="released")
        # ... and the same release: bytes and slot given back.
        assert run.processor._inflight_bytes == 0
        assert run.processor.slots.free == 2
    assert run.processor.stats.succeeded == 1
    assert run.processor.stats.delivered == (door == "delivered")


async def _stopping_in_drain(run: Armed) -> None:
    """The server's shutdown: drain waits for the running handler."""
    asyncio.get_running_loop().create_task(run.processor.drain(10.0))
    await wait_until(lambda: not run.processor._fetching, what="stopping")


async def _stopping_after_stop(run: Armed) -> None:
    """``Server.stop`` (SIGTSTP): no more fetching, the running handler goes on."""
    run.processor.stop_fetching()


@pytest.mark.parametrize("stopping", [_stopping_in_drain, _stopping_after_stop])
async def test_a_delivery_arriving_while_the_processor_stops_is_requeued_never_started(
    stopping: Any,
) -> None:
    fake = FakeBroker()
    release = asyncio.Event()
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")
        await release.wait()

    run = Armed(fake, handler, concurrency=3)  # free slots: only the stop refuses the task
    async with run:
        await wait_until(lambda: fake.credits.get(SERVER) == 1, what="armed")
        first = run.deliver()
        await wait_until(lambda: ran == [first], what="the first task running")
        await stopping(run)
        fake.credits[SERVER] = 1  # published before the disarm ran
        fake.waiters[Q].append(SERVER)
        late = run.deliver()
        await wait_until(lambda: fake.state(late) == "pending", what="the requeue")
        assert run.processor.slots.free == 2  # it never took a slot
        release.set()
    assert ran == [first]  # never started
    assert fake.state(first) is None  # finished and acknowledged
    assert fake.pending[Q] == [late]  # not lost: back to pending for the next worker
    assert fake.called("requeue") == [late]


async def test_a_delivery_held_by_a_fetch_when_the_processor_stops_is_requeued() -> None:
    # Delivered while the idle processor's fetch held every slot (its only one), and the stop
    # comes before the fetch returns: the held task goes back to pending instead of starting.
    fake = FakeBroker()
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")

    run = Armed(fake, handler, concurrency=1)
    async with run:
        await wait_until(lambda: fake.credits.get(SERVER) == 1, what="armed")
        hold = fake.hold("fetch")
        run.wakeup.set()
        await asyncio.wait_for(hold.arrived.wait(), 10)
        held = run.deliver()
        run.processor.stop_fetching()
        hold.release.set()
        await wait_until(lambda: fake.state(held) == "pending", what="the requeue")
    assert ran == []
    assert fake.pending[Q] == [held]
    assert fake.called("requeue") == [held]
