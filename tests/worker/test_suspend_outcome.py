"""A durable run's attempt that suspends, and a durable step's acknowledgement, as the worker
decides and writes them (asyncq._worker.outcome and the processor, on the fake broker)."""

from __future__ import annotations

import structlog

from asyncq import Limits
from asyncq._broker.durable import (
    FAR_FUTURE,
    RUN_HEADER,
    RUN_QUEUE_HEADER,
    STEP_HEADER,
    RunSuspended,
    SuspendPlan,
)
from asyncq._worker.outcome import decide
from asyncq._worker.server import Server
from asyncq.task import Task
from tests.support.fakebroker import FakeBroker
from tests.support.helpers import wait_until
from tests.support.roles import Running, message

LOG = structlog.get_logger("test")
CFG = Server("redis://127.0.0.1:9/0").config
STEP = {RUN_HEADER: "r1", RUN_QUEUE_HEADER: "default", STEP_HEADER: "3"}


def test_a_suspension_is_its_own_outcome_whatever_the_retries_left() -> None:
    plan = SuspendPlan("sleep", until=5.0)
    for retried in (0, 3):
        m = message(id="r1", retried=retried)
        out = decide(m, RunSuspended(plan), lease="held", config=CFG, now=0.0, log=LOG)
        assert (out.kind, out.plan, out.err_msg) == ("suspend", plan, "")
    # awaited in a TaskGroup, steps raise their suspensions in a group: one is written (the
    # replay it resumes asks for the others again)
    other = SuspendPlan("steps")
    group = BaseExceptionGroup("steps", [RunSuspended(plan), RunSuspended(other)])
    out = decide(message(id="r1"), group, lease="held", config=CFG, now=0.0, log=LOG)
    assert out.kind == "suspend" and out.plan in (plan, other)
    out = decide(message(id="r1"), RunSuspended(plan), lease="expired", config=CFG, now=0, log=LOG)
    assert out.kind == "lost"  # another server owns the run now: its replay decides again


def test_a_durable_steps_outcomes_are_acknowledged_with_its_run() -> None:
    for exc, kind in ((None, "complete"), (ValueError("x"), "archive")):
        m = message(id="r1-3", headers=STEP, retention=60, retry=0)
        out = decide(m, exc, lease="held", config=CFG, now=0.0, log=LOG)
        assert (out.kind, out.durable, out.workflow) == (kind, True, False)
    # headers no asyncq wrote make it a plain task
    for index in ("three", "²"):  # the scripts read an index of ASCII digits only
        m = message(id="x", headers={**STEP, STEP_HEADER: index})
        assert not decide(m, None, lease="held", config=CFG, now=0.0, log=LOG).durable


async def test_a_suspended_run_is_parked_not_failed() -> None:
    fake = FakeBroker()
    run = fake.enqueue(message(id="r1"))
    step = message(id="r1-0", headers={**STEP, STEP_HEADER: "0"})
    plan = SuspendPlan("steps", steps=[(0, step)], waits=[0])
    handled: list[str] = []

    async def handler(task: Task) -> None:
        handled.append(task.id or "")
        if task.id == "r1":
            raise RunSuspended(plan)

    async with Running(fake, handler, error_handler=lambda t, e: handled.append("error")) as r:
        await wait_until(lambda: fake.durable_steps, what="the step acknowledged")
    assert fake.suspensions == [("r1", plan)]
    assert fake.tasks[run.id].state == "scheduled" and fake.tasks[run.id].score == FAR_FUTURE
    assert handled == ["r1", "r1-0"]  # the step ran; no error handler for the suspension
    assert fake.durable_steps == [("r1-0", "done")]
    assert r.processor.stats.failed == 0
    # a step's success is acknowledged in the batch of successes, with its record
    assert fake.called("ack_many") and not fake.called("ack_durable_step")


async def test_a_run_its_steps_success_wakes_continues_in_the_steps_slot() -> None:
    # concurrency 1: the step's slot is the only one; the run starts in it without a fetch
    fake = FakeBroker()
    run = fake.enqueue(message(id="r1"))
    step = message(id="r1-0", headers={**STEP, STEP_HEADER: "0"})
    plan = SuspendPlan("steps", steps=[(0, step)], waits=[0])
    handled: list[str] = []
    pending_when_it_continued: list[list[str]] = []

    async def handler(task: Task) -> None:
        handled.append(task.id or "")
        if task.id == "r1" and len(handled) == 1:
            raise RunSuspended(plan)  # parks the run; the fake enqueues its step
        if task.id == "r1-0":
            fake.wakes["r1-0"] = "r1"  # its success wakes the run
        elif task.id == "r1":
            pending_when_it_continued.append(list(fake.pending["default"]))

    async with Running(fake, handler, concurrency=1) as r:
        await wait_until(lambda: handled == ["r1", "r1-0", "r1"], what="the run continued")
        # the step in the slot the run left (leased by the suspension), then the run in
        # the step's
        assert r.processor.stats.continued == 2
        assert fake.called("suspend_run") == [("r1", "steps", True)]
        await wait_until(lambda: run.id not in fake.tasks, what="the run acknowledged")
    # the run went from parked to active in the step's acknowledgement: never pending
    assert pending_when_it_continued == [[]]
    assert fake.durable_steps == [("r1-0", "done")]


async def test_a_run_woken_while_the_processor_stops_goes_back_to_pending() -> None:
    fake = FakeBroker()
    run = fake.enqueue(message(id="r1"))
    fake.tasks[run.id].state = "scheduled"  # parked
    fake.pending["default"].clear()
    step = fake.enqueue(message(id="r1-0", headers={**STEP, STEP_HEADER: "0"}))
    fake.wakes[step.id] = run.id
    hold = fake.hold("ack_many")
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")

    async with Running(fake, handler) as r:
        await hold.arrived.wait()
        assert r.processor._runs_here("default")
        r.processor.stop_fetching()
        # asked before the stop: the run continues here, then finds the processor stopping
        hold.release.set()
        await wait_until(lambda: fake.called("requeue"), what="the run requeued")
        assert not r.processor._runs_here("default")
    assert ran == ["r1-0"]
    assert fake.called("requeue") == [run.id]
    assert fake.tasks[run.id].state == "pending"


def test_only_a_served_unlimited_queue_with_room_takes_a_woken_run() -> None:
    fake = FakeBroker()

    async def handler(task: Task) -> None:
        return None

    limits = Limits(local_queue_concurrency={"limited": 2}, rate_limits={"rated": "5/s"})
    served = Running(fake, handler, queues={"default": 1, "limited": 1, "rated": 1}, limits=limits)
    processor = served.processor
    assert processor._runs_here("default")
    assert not processor._runs_here("elsewhere")  # not served here
    assert not processor._runs_here("limited")  # a fetch applies the limit
    assert not processor._runs_here("rated")
    processor._inflight_bytes = processor._max_bytes
    assert not processor._runs_here("default")  # no room under max_inflight_bytes


async def test_a_durable_steps_outcome_wakes_no_result_waiter() -> None:
    # Nobody waits for a step's result (its run reads its record): no completion notice
    # is published for it, kept or archived; a plain task kept still gets one.
    fake = FakeBroker()
    fake.enqueue(message(id="r1-0", headers={**STEP, STEP_HEADER: "0"}, retention=60))
    fake.enqueue(message(id="r1-1", headers={**STEP, STEP_HEADER: "1"}, retry=0))
    fake.enqueue(message(id="plain", retention=60))

    async def handler(task: Task) -> None:
        if task.id == "r1-1":
            raise ValueError("boom")

    async with Running(fake, handler) as r:
        await wait_until(lambda: len(fake.durable_steps) == 2, what="the steps acknowledged")
        await wait_until(lambda: r.notifier.sent, what="the plain task's notice")
    assert sorted(fake.durable_steps) == [("r1-0", "complete"), ("r1-1", "archive")]
    assert r.notifier.sent == ["plain"]


async def test_a_step_whose_queue_is_not_served_here_is_left_to_a_fetch() -> None:
    fake = FakeBroker()
    fake.enqueue(message(id="r1"))
    elsewhere = message(id="r1-0", queue="elsewhere", headers={**STEP, STEP_HEADER: "0"})
    plan = SuspendPlan("steps", steps=[(0, elsewhere)], waits=[0])
    handled: list[str] = []

    async def handler(task: Task) -> None:
        handled.append(task.id or "")
        raise RunSuspended(plan)

    async with Running(fake, handler) as r:
        await wait_until(lambda: fake.suspensions, what="the run suspended")
        assert r.processor.stats.continued == 0
    assert fake.called("suspend_run") == [("r1", "steps", False)]
    assert fake.pending["elsewhere"] == ["r1-0"] and handled == ["r1"]
