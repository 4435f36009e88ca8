"""The processor's side of direct delivery, on the fake broker.

When it asks to be delivered tasks (arming), what it registers, how a delivered task starts
without a fetch, and what happens to one it cannot run: no slot, a stop, an unreadable
note. The scripts' side is in test_delivery.py, against Redis.
"""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from asyncq import Limits
from asyncq._broker.delivery import DeliveryNote, parse_note
from asyncq._worker.arming import DELIVERY_TTL, REGISTER_EVERY
from asyncq.mux import sync_limiter, sync_threads
from asyncq.task import Task
from tests.support.fakebroker import FakeBroker
from tests.support.helpers import wait_until
from tests.support.roles import SERVER, Armed, Q, message


def _arms(fake: FakeBroker) -> list[list[str]]:
    """The queues of each arm_delivery call ([] for a renewal)."""
    return [queues for server, queues in fake.called("arm_delivery") if server == SERVER]


async def _noop(task: Task) -> None:
    return None


async def test_an_idle_processor_registers_once_then_renews_its_credit() -> None:
    fake = FakeBroker()
    async with Armed(fake, _noop) as run:
        await wait_until(lambda: _arms(fake), what="the first arm")
        assert _arms(fake) == [[Q]]
        assert fake.waiters[Q] == [SERVER] and fake.credits[SERVER] == 1
        # The idle polls renew the credit, at most every third of its TTL, without the queues.
        fetches = len(fake.fetches)
        run.wakeup.set()
        await wait_until(lambda: len(fake.fetches) > fetches, what="a fetch")
        assert _arms(fake) == [[Q]]
        fake.advance(DELIVERY_TTL / 3)
        run.wakeup.set()
        await wait_until(lambda: len(_arms(fake)) == 2, what="a renewal")
        assert _arms(fake)[1] == []
        # Every REGISTER_EVERY seconds the lists are written again (a queue rm drops them).
        fake.advance(REGISTER_EVERY)
        run.wakeup.set()
        await wait_until(lambda: len(_arms(fake)) == 3, what="a registration")
        assert _arms(fake)[2] == [Q]
    # Shutdown leaves the lists and drops the credit.
    assert fake.called("disarm_delivery") == [(SERVER, [Q])]
    assert fake.waiters[Q] == [] and SERVER not in fake.credits


async def test_an_expired_credit_registers_again() -> None:
    fake = FakeBroker()
    async with Armed(fake, _noop) as run:
        await wait_until(lambda: _arms(fake), what="the first arm")
        del fake.credits[SERVER]  # expired in Redis
        fake.advance(DELIVERY_TTL / 3)
        run.wakeup.set()
        await wait_until(lambda: len(_arms(fake)) == 3, what="renewal, then registration")
        assert _arms(fake)[1:] == [[], [Q]]
        assert fake.credits[SERVER] == 1


async def test_a_delivered_task_runs_without_a_fetch_and_the_processor_asks_again() -> None:
    fake = FakeBroker()
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")

    async with Armed(fake, handler) as run:
        await wait_until(lambda: fake.credits.get(SERVER) == 1, what="armed")
        # FakeBroker.deliver never puts the task in pending: no fetch can run it.
        for _ in range(3):
            tid = run.deliver()
            await wait_until(lambda tid=tid: tid in ran, what="the delivered task")
            await wait_until(lambda: fake.credits[SERVER] == 1, what="armed again")
        await wait_until(lambda: not fake.tasks, what="acknowledged")
        assert run.processor.stats.delivered == 3
        assert fake.processed == 3
        # Renewals after a delivery do not wait for the TTL's third: the credit was spent.
        assert _arms(fake) == [[Q], [], [], []]


async def test_limited_queues_are_never_delivered_from() -> None:
    fake = FakeBroker()
    queues = {Q: 1, "capped": 1, "rated": 1, "free": 1}
    limits = Limits(local_queue_concurrency={"capped": 2}, rate_limits={"rated": "5/s"})
    async with Armed(fake, _noop, queues=queues, limits=limits):
        await wait_until(lambda: _arms(fake), what="the first arm")
        assert sorted(_arms(fake)[0]) == sorted([Q, "free"])


async def test_only_limited_queues_never_arm() -> None:
    fake = FakeBroker()
    async with Armed(fake, _noop, limits=Limits(queue_concurrency={Q: 3})) as run:
        await wait_until(lambda: len(fake.fetches) >= 2 or run.processor.stats.empty_fetches)
        await asyncio.sleep(0.05)
        assert _arms(fake) == []


async def test_burst_mode_never_arms() -> None:
    fake = FakeBroker()
    fake.enqueue(message())
    async with Armed(fake, _noop, burst=True) as run:
        await wait_until(lambda: not fake.tasks, what="the burst")
        await wait_until(lambda: not run.processor._fetching, what="the burst to end")
    assert _arms(fake) == []


async def test_a_task_delivered_while_every_slot_is_taken_goes_back_to_pending() -> None:
    fake = FakeBroker()
    release = asyncio.Event()
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")
        await release.wait()

    async with Armed(fake, handler, concurrency=1) as run:
        await wait_until(lambda: fake.credits.get(SERVER) == 1, what="armed")
        first = run.deliver()
        await wait_until(lambda: ran == [first], what="the first task")
        # The slot is taken: the processor does not ask again (it has nowhere to run one).
        assert fake.credits[SERVER] == 0
        fake.credits[SERVER] = 1  # a credit left from before, as after a fetch filled it
        second = run.deliver()
        await wait_until(lambda: fake.state(second) == "pending", what="the requeue")
        assert fake.called("requeue") == [second]
        release.set()
        await wait_until(lambda: second in ran, what="the second task, fetched")
        await wait_until(lambda: not fake.tasks, what="both acknowledged")


async def test_a_task_delivered_while_a_fetch_holds_the_slots_starts_when_it_returns() -> None:
    # An idle processor's poll holds the slots it fetches for (half of them, here its only
    # one) for its round trip: a task delivered when none is left free starts in one of
    # them once the fetch gives them back, not via pending.
    fake = FakeBroker()
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")

    async with Armed(fake, handler, concurrency=1) as run:
        await wait_until(lambda: fake.credits.get(SERVER) == 1, what="armed")
        hold = fake.hold("fetch")
        run.wakeup.set()
        await asyncio.wait_for(hold.arrived.wait(), 10)
        assert run.processor.slots.free == 0  # the fetch in flight holds the slot
        tid = run.deliver()
        assert ran == [] and fake.state(tid) == "active"
        hold.release.set()
        await wait_until(lambda: tid in ran, what="the delivered task")
        await wait_until(lambda: not fake.tasks, what="acknowledged")
        assert fake.called("requeue") == []
        assert run.processor.stats.delivered == 1
        assert fake.processed == 1


async def test_an_unreadable_note_is_logged_and_starts_nothing() -> None:
    fake = FakeBroker()
    with capture_logs() as logs:
        async with Armed(fake, _noop) as run:
            await wait_until(lambda: _arms(fake), what="armed")
            run.processor.receive_delivery(b"not a note")
            run.processor.receive_delivery(b"17 5 1 ab")  # shorter than its header says
            await asyncio.sleep(0.05)
            assert not run.processor.active
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["event"] for e in errors] == [
        "unreadable delivery; the task is recovered when its lease expires"
    ] * 2
    assert "malformed delivery note" in errors[0]["error"]
    assert "shorter than its header says" in errors[1]["error"]


def test_a_note_exactly_as_long_as_its_header_says_is_read_and_one_byte_less_is_not() -> None:
    # The boundary of the length check: queue and id filling the rest, with no message,
    # still parse (the message decodes as unusable later); one byte fewer is refused here.
    assert parse_note(b"17 7 3 defaultabc") == DeliveryNote(17, "default", "abc", b"")
    assert parse_note(b"17 7 3 defaultabc\x0a\x01t") == DeliveryNote(
        17, "default", "abc", b"\x0a\x01t"
    )
    with pytest.raises(ValueError, match="shorter than its header says"):
        parse_note(b"17 7 3 defaultab")


async def test_a_task_delivered_during_shutdown_is_requeued() -> None:
    fake = FakeBroker()
    release = asyncio.Event()

    async def handler(task: Task) -> None:
        await release.wait()

    run = Armed(fake, handler, concurrency=2)
    async with run:
        await wait_until(lambda: fake.credits.get(SERVER) == 1, what="armed")
        first = run.deliver()
        await wait_until(lambda: run.processor.active, what="the first task running")
        run.processor.stop_fetching()
        fake.credits[SERVER] = 1  # published before the disarm ran
        late = run.deliver()
        await wait_until(lambda: fake.state(late) == "pending", what="the requeue")
        release.set()
    assert fake.state(first) is None  # finished and acknowledged
    assert fake.pending[Q] == [late]


async def test_a_failed_arm_is_logged_and_retried_after_the_next_empty_fetch() -> None:
    fake = FakeBroker()
    fake.fail("arm_delivery")
    with capture_logs() as logs:
        async with Armed(fake, _noop) as run:
            await wait_until(lambda: fake.credits.get(SERVER) == 1, what="armed at last")
            assert len(fake.called("arm_delivery")) == 2
            assert run.processor.stats.fetch_errors == 0
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert warning["event"] == "could not ask for direct delivery; tasks are fetched instead"
    assert warning["error"] == "ConnectionError: fake arm_delivery failed"


async def test_a_delivered_task_runs_in_the_processors_context() -> None:
    # Started from the subscriber's turn of the loop, not the fetch loop's: its handler
    # still sees the processor's limiter of sync handler threads (sync_concurrency).
    fake = FakeBroker()
    seen: list[object] = []

    async def handler(task: Task) -> None:
        seen.append((sync_threads.get(None), sync_limiter()))

    async with Armed(fake, handler, limits=Limits(sync_concurrency=3)) as run:
        await wait_until(lambda: fake.credits.get(SERVER) == 1, what="armed")
        tid = run.deliver()
        await wait_until(lambda: seen, what=f"task {tid}")
        threads = run.processor._threads
        assert seen == [(threads, threads.limiter)]
        assert threads.limiter.total_tokens == 3


async def test_a_delivery_after_the_processor_stopped_is_left_to_its_lease() -> None:
    fake = FakeBroker()
    run = Armed(fake, _noop)
    async with run:
        await wait_until(lambda: fake.credits.get(SERVER) == 1, what="armed")
        run.processor.stop_fetching()  # Server.stop(): the disarm is sent once...
        run.processor.stop_fetching()  # ... and a second stop (the shutdown) sends nothing
    assert len(fake.called("disarm_delivery")) == 1
    # published before the disarm ran, heard after the stop
    fake.credits[SERVER] = 1
    fake.waiters[Q].append(SERVER)
    note = fake.deliver(message(), SERVER)
    assert note is not None
    with capture_logs() as logs:
        run.processor.receive_delivery(note)
    (logged,) = logs
    assert logged["event"].startswith("task delivered after the processor stopped")
    assert logged["log_level"] == "warning"


async def test_an_ask_for_delivery_landing_after_the_stop_is_withdrawn_again() -> None:
    fake = FakeBroker()
    hold = fake.hold("arm_delivery")
    async with Armed(fake, _noop) as run:
        await hold.arrived.wait()  # the first ask for a delivery, on its way
        run.processor.stop_fetching()  # the stop's withdrawal lands before it
        await wait_until(lambda: fake.called("disarm_delivery"), what="the stop's withdrawal")
        hold.release.set()  # then the ask lands: this server has a credit again ...
        await wait_until(
            lambda: len(fake.called("disarm_delivery")) == 2, what="the ask withdrawn again"
        )
    assert SERVER not in fake.credits  # ... and no longer: nothing is delivered to it
    assert SERVER not in fake.waiters[Q]
