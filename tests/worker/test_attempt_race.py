"""The per-task select on the fake broker: which of {handler done, lease expired, cancel} came
first decides the attempt, when they land in the same turn of the event loop.

The handler makes the other event happen from its own last step: either before it returns (the
event came first, though the loop has yet to run its callbacks when the coroutine resumes), or
scheduled for right after its return (the handler's end came first, and the event lands before
the outcome's write).
"""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from asyncq.errors import TaskCanceledError
from asyncq.task import Task
from tests.support.fakebroker import FakeBroker
from tests.support.helpers import wait_until
from tests.support.roles import Running, message


def _racing(fake: FakeBroker, event: str, order: str) -> Running:
    """A processor whose handler's last step makes *event* happen, *order* to its end."""

    async def handler(task: Task) -> None:
        await asyncio.sleep(0)  # running: its coroutine waits on the select
        tid = task.id or ""

        def happen() -> None:
            if event == "lease":
                run.active[tid].lease.expire()
            else:
                run.active.cancel(tid, TaskCanceledError())

        if order == "event first":
            happen()
        else:
            asyncio.get_running_loop().call_soon(happen)

    run = Running(fake, handler)
    return run


def _finished(run: Running) -> bool:
    stats = run.processor.stats
    return stats.succeeded + stats.failed == 1 and not run.active


@pytest.mark.parametrize("order", ["event first", "handler first"])
async def test_a_lease_expiring_as_the_handler_returns_is_decided_by_which_came_first(
    order: str,
) -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    run = _racing(fake, "lease", order)
    with capture_logs() as logs:
        async with run:
            await wait_until(lambda: _finished(run), what="finished and released")
            assert run.processor.slots.free == run.processor.slots.capacity
    warned = {e["event"] for e in logs if e["log_level"] == "warning"}
    if order == "event first":  # the lease is gone: nothing is written, the recoverer owns it
        assert fake.state(msg.id) == "active"
        assert not fake.called("ack_many") and not fake.called("retry")
        assert run.processor.stats.failed == 1
        assert warned == {"task lease expired; handler cancelled"}
    else:  # the handler's end came first and was decided on a lease still held
        assert msg.id not in fake.tasks and fake.processed == 1
        assert run.processor.stats.succeeded == 1
        assert not warned


@pytest.mark.parametrize("order", ["event first", "handler first"])
async def test_a_cancel_as_the_handler_returns_is_decided_by_which_came_first(order: str) -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    run = _racing(fake, "cancel", order)
    async with run:
        await wait_until(lambda: _finished(run), what="finished and released")
    if order == "event first":  # a done context wins over what the handler did after it
        assert fake.state(msg.id) == "retry"
        assert fake.tasks[msg.id].error == "context canceled"
        assert run.processor.stats.failed == 1
    else:  # the cancel came after the handler returned: it changes nothing
        assert msg.id not in fake.tasks and fake.processed == 1
        assert run.processor.stats.succeeded == 1
