"""A durable run's step run inline (``Attempts.run_inline``) on the in-memory broker of
tests/support/fakebroker.py: the step runs in the slot of the attempt that awaits it, its
result goes with its acknowledgement, and an acknowledgement Redis could not take goes to
the syncer with that result written first. The handler here does what a durable run's
attempt does at a step (``DurableFunction.serve``): it asks the worker to run the step."""

from __future__ import annotations

import time

import pytest

from asyncq import Limits
from asyncq._broker.durable import (
    INLINE_STEPS,
    RUN_HEADER,
    RUN_QUEUE_HEADER,
    STEP_HEADER,
    SuspendPlan,
)
from asyncq.task import Task
from tests.support.fakebroker import FakeBroker, StoredTask
from tests.support.helpers import wait_until
from tests.support.roles import Q, Running, message


def one_step() -> SuspendPlan:
    headers = {RUN_HEADER: "r1", RUN_QUEUE_HEADER: Q, STEP_HEADER: "0"}
    step = message("step", id="r1-0", headers=headers)
    return SuspendPlan("steps", steps=[(0, step)], waits=[0])


class Run:
    """The handler of run r1 (its attempt awaits one step) and of its step."""

    def __init__(self) -> None:
        self.got: list[bytes | None] = []

    async def __call__(self, task: Task) -> None:
        if task.type == "step":
            await task.result_writer.write(b"42")  # type: ignore[union-attr]
            return
        inline = INLINE_STEPS.get()
        assert inline is not None  # set by the processor for every task it runs
        self.got.append(await inline.run_inline("r1", one_step()))


async def test_a_step_runs_inline_in_its_runs_slot_and_its_result_goes_with_its_ack() -> None:
    fake = FakeBroker(now=time.time())  # the handler's result writer reads the real clock
    fake.enqueue(message("run", id="r1"))
    handler = Run()
    # one slot: the step can only run in the slot of the attempt that awaits it
    async with Running(fake, handler, concurrency=1) as run:
        await wait_until(lambda: handler.got, what="the attempt went on")
        assert handler.got == [b"42"]
        assert fake.inline_steps == [("r1", "r1-0")]
        assert fake.called("write_result") == []  # held, written by the acknowledgement
        assert run.deps.stats.inline == 1
        await wait_until(lambda: "r1" not in fake.tasks, what="the run acknowledged")
        assert run.processor.slots.free == run.processor.slots.capacity
    assert "r1-0" not in fake.tasks
    assert fake.durable_steps == [("r1-0", "done")]


async def test_an_inline_steps_ack_redis_could_not_take_writes_its_result_first() -> None:
    fake = FakeBroker(now=time.time())  # the handler's result writer reads the real clock
    fake.enqueue(message("run", id="r1"))
    fake.fail("ack_many")  # the step's acknowledgement: the first batch
    handler = Run()
    async with Running(fake, handler, concurrency=1) as run:
        await wait_until(lambda: handler.got, what="the attempt went on")
        assert handler.got == [None]  # not recorded: the attempt suspends after all
        ((what, write),) = run.deferred.writes
        assert what == "done"
        await write()  # what the syncer does once Redis answers again
    assert fake.called("write_result") == ["r1-0"]
    assert fake.called("ack_durable_step") == [("r1-0", "done")]
    written = [method for method, _ in fake.calls if method in ("write_result", "ack_durable_step")]
    assert written == ["write_result", "ack_durable_step"]


@pytest.mark.parametrize("why", ["enqueued before", "limited here"])
async def test_a_step_not_taken_inline_leaves_the_attempt_to_suspend(why: str) -> None:
    fake = FakeBroker(now=time.time())  # the handler's result writer reads the real clock
    fake.enqueue(message("run", id="r1"))
    options: dict[str, object] = {}
    if why == "enqueued before":
        # as an earlier attempt left it, waiting for a retry (not fetched meanwhile)
        fake.tasks["r1-0"] = StoredTask(one_step().steps[0][1], "retry")
    else:  # a queue with a limit here gives its tasks only through a fetch
        options["limits"] = Limits(local_queue_concurrency={Q: 2})
    handler = Run()
    async with Running(fake, handler, concurrency=2, **options) as run:
        await wait_until(lambda: handler.got, what="the attempt went on")
        assert handler.got == [None]
        assert run.deps.stats.inline == 0
    started = fake.called("start_inline_steps")
    assert started == ([[("r1", "r1-0")]] if why == "enqueued before" else [])
