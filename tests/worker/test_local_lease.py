"""The worker's local lease of a fetched task, on the fake broker of tests/support/fakebroker.py.

Redis stores a lease's expiry in whole seconds, truncated (asynq's ``ZADD`` of a unix
second); a fetch made at a fractional time hands the processor the exact expiry. The
local lease must end at the second Redis holds, never after it: between the two, the
recoverer may already have given the task to another worker.
"""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from asyncq.task import Task
from tests.support.fakebroker import FakeBroker
from tests.support.helpers import wait_until
from tests.support.roles import Running, message


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
