"""The worker core's edges that the role tests left open, on the in-memory broker.

Each test here pins a behaviour that a mutant of the worker core (``nox -s
mutation``; docs/testing.md) changed without any test noticing: the forwarder's
and recoverer's counters across ticks, the recoverer's choice between retry and
archive and the deadline it writes under, the heartbeater's records, the lease's
one-way extension, the outcome decision's edges; the processor's type rate limit,
its lost leases, orphans and failed writes, with the events each is logged as.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from redis.exceptions import ResponseError
from structlog.testing import capture_logs

from asyncq import Intervals, Limits
from asyncq._broker.workflow import WORKFLOW_HEADER, WORKFLOW_QUEUE_HEADER, WORKFLOW_STEP_HEADER
from asyncq._worker import active as active_module
from asyncq._worker import policy
from asyncq._worker.active import ActiveTask, ActiveTasks
from asyncq._worker.forwarder import Forwarder
from asyncq._worker.heartbeater import Heartbeater, ServerIdentity
from asyncq._worker.lease import Lease, extend_leases
from asyncq._worker.limits import TYPE_RATE_MAX_WAIT_US
from asyncq._worker.outcome import decide
from asyncq._worker.recoverer import Recoverer
from asyncq._worker.roles import RoleDeps
from asyncq.errors import (
    DeadlineExceededError,
    LeaseExpiredError,
    RateLimited,
    RevokeTask,
    SkipRetry,
    TaskCanceledError,
    TaskNotFoundError,
)
from asyncq.hooks import NoWorkerHooks
from asyncq.mux import ServeMux
from asyncq.proto.asynq import ServerInfo, TaskMessage, WorkerInfo
from asyncq.task import Task
from tests.support.fakebroker import FakeBroker
from tests.support.helpers import wait_until
from tests.support.roles import Q, Running, _fails, _returns, message, role_deps
from tests.support.roles import _rate_limited as _rate_limited_handler


async def _in_retry(fake: FakeBroker, *due: float) -> list[str]:
    """Tasks in the retry set, due at the given unix times; their ids."""
    msgs = [fake.enqueue(message()) for _ in due]
    await fake.fetch([Q], len(msgs))
    for msg, at in zip(msgs, due, strict=True):
        await fake.retry(msg, datetime.fromtimestamp(at, UTC), "e", is_failure=True)
    return [m.id for m in msgs]


# -- forwarder -----------------------------------------------------------------------------------


async def test_the_forwarders_count_adds_up_over_ticks() -> None:
    fake = FakeBroker()
    first, second = await _in_retry(fake, fake.now, fake.now + 10)
    deps = role_deps(fake)
    fwd = Forwarder(deps, 5.0, wakeup=asyncio.Event())
    await fwd.tick()
    fake.advance(10)
    await fwd.tick()
    assert fake.state(first) == fake.state(second) == "pending"
    assert deps.stats.forwarded == 2


async def test_the_forwarder_runs_at_its_interval_until_stopped() -> None:
    fake = FakeBroker()
    fwd = Forwarder(role_deps(fake), 0.05, wakeup=asyncio.Event())
    assert fwd.interval == 0.05
    running = asyncio.create_task(fwd.run())
    await wait_until(lambda: len(fake.called("forward_queues")) >= 3, what="three passes")
    fwd.request_stop()
    await asyncio.wait_for(running, 5)


# -- heartbeater ---------------------------------------------------------------------------------


class _Recorded:
    """write_server_state's arguments, as the heartbeater passed them."""

    def __init__(self, fake: FakeBroker) -> None:
        self.calls: list[dict[str, Any]] = []
        write = fake.write_server_state

        async def record(
            info: ServerInfo, workers: Sequence[WorkerInfo], ttl: float, **kw: Any
        ) -> None:
            self.calls.append({"info": info, "workers": list(workers), "ttl": ttl, **kw})
            await write(info, workers, ttl, **kw)

        fake.write_server_state = record  # type: ignore[method-assign]


def _heartbeater(deps: RoleDeps, active: ActiveTasks, interval: float = 5.0) -> Heartbeater:
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return Heartbeater(
        deps,
        interval,
        active=active,
        identity=ServerIdentity("host-a", 4242, "srv-1"),
        status=lambda: "active",
        started_at=lambda: started,
    )


async def test_the_heartbeat_publishes_the_server_and_each_running_task() -> None:
    fake = FakeBroker(lease_duration=30)
    running = fake.enqueue(message("email", payload=b"p1", timeout=60))
    (got,) = (await fake.fetch([Q], 1)).tasks
    deps = role_deps(
        fake,
        concurrency=7,
        queues={Q: 3, "low": 1},
        strict_priority=True,
        limits=Limits(
            type_rate_limits={"email": "10/s"},
            queue_concurrency={Q: 4},
            local_queue_concurrency={"low": 2},
            rate_limits={"low": "5/s"},
            ordered_queues=["low"],
        ),
    )
    active = ActiveTasks()
    lease = Lease(got.lease_expiry, clock=fake.clock)
    active[running.id] = ActiveTask(running, lease, fake.now + 60, fake.now - 1.5)
    recorded = _Recorded(fake)
    await _heartbeater(deps, active).tick()
    ((call),) = recorded.calls
    info: ServerInfo = call["info"]
    assert (info.host, info.pid, info.server_id) == ("host-a", 4242, "srv-1")
    assert (info.concurrency, info.strict_priority, info.status) == (7, True, "active")
    assert info.queues == {Q: 3, "low": 1}
    assert info.start_time == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert info.active_worker_count == 1
    (worker,) = call["workers"]
    assert (worker.host, worker.pid, worker.server_id) == ("host-a", 4242, "srv-1")
    assert (worker.task_id, worker.task_type, worker.task_payload, worker.queue) == (
        running.id,
        "email",
        b"p1",
        Q,
    )
    assert worker.start_time == datetime.fromtimestamp(fake.now - 1.5, UTC)
    assert worker.deadline == datetime.fromtimestamp(fake.now + 60, UTC)
    assert call["ttl"] == 10.0  # twice the interval, as asynq
    assert call["type_rates"] == {"email": str(deps.config.type_rate_limits["email"])}
    assert call["queue_flow"] == {
        f"limit:{Q}": "4",
        "local:low": "2",
        "rate:low": str(deps.config.rate_limits["low"]),
        "ordered:low": "1",
    }


async def test_a_sub_second_heartbeat_still_gives_its_records_two_seconds() -> None:
    fake = FakeBroker()
    recorded = _Recorded(fake)
    await _heartbeater(role_deps(fake), ActiveTasks(), interval=0.5).tick()
    assert recorded.calls[0]["ttl"] == 2.0
    recorded.calls.clear()
    await _heartbeater(role_deps(fake), ActiveTasks(), interval=1.5).tick()
    assert recorded.calls[0]["ttl"] == 3.0


async def test_the_heartbeat_extends_only_live_leases_it_still_owns() -> None:
    fake = FakeBroker(lease_duration=30)
    for _ in range(3):
        fake.enqueue(message())
    live, lost, left = (await fake.fetch([Q], 3)).tasks
    active = ActiveTasks()
    for got in (live, lost, left):
        lease = Lease(got.lease_expiry, clock=fake.clock)
        active[got.message.id] = ActiveTask(got.message, lease, fake.now + 60, fake.now)
    active[lost.message.id].lease.expires_at = fake.now + 5  # its extension never landed
    active[left.message.id].abandoned = True  # requeued at shutdown: another worker's now
    fake.advance(10)
    await _heartbeater(role_deps(fake), active).tick()
    assert fake.called("extend_lease") == [(Q, [live.message.id])]
    assert active[live.message.id].lease.expires_at == int(fake.now + 30)
    # Declared expired (its coroutine stops the handler): the lost lease's event alone.
    expired = [tid for tid, act in active.items() if act.lease.expired.done()]
    assert expired == [lost.message.id]
    assert len(fake.servers["srv-1"][1]) == 3  # all three still run here


async def test_a_queue_whose_leases_cannot_be_extended_is_logged_with_its_tasks() -> None:
    fake = FakeBroker(lease_duration=30)
    fake.enqueue(message())
    (got,) = (await fake.fetch([Q], 1)).tasks
    active = ActiveTasks()
    active[got.message.id] = ActiveTask(
        got.message, Lease(got.lease_expiry, clock=fake.clock), fake.now + 60, fake.now
    )
    beat = _heartbeater(role_deps(fake), active)
    fake.fail("extend_lease", ValueError("blank queue name"))
    with capture_logs() as logs:
        await beat.tick()
    (refused,) = [e for e in logs if e["event"] == "could not extend task leases"]
    assert refused["log_level"] == "error"
    assert (refused["queue"], refused["task_ids"]) == (Q, [got.message.id])
    assert refused["error"] == "ValueError: blank queue name"
    fake.fail("extend_lease")  # Redis unreachable: a warning, rate-limited
    with capture_logs() as logs:
        await beat.tick()
    (down,) = [e for e in logs if e["event"] == "could not extend task leases"]
    assert (down["log_level"], down["queue"]) == ("warning", Q)
    assert down["error"] == "ConnectionError: fake extend_lease failed"
    assert "task_ids" not in down
    assert fake.servers["srv-1"][1][0].task_id == got.message.id  # the beat went on


async def test_a_server_state_that_cannot_be_cleared_is_left_to_expire() -> None:
    fake = FakeBroker()
    beat = _heartbeater(role_deps(fake), ActiveTasks())
    await beat.tick()
    cleared: list[tuple[str, int, str]] = []
    clear = fake.clear_server_state

    async def record(host: str, pid: int, server_id: str) -> None:
        cleared.append((host, pid, server_id))
        await clear(host, pid, server_id)

    fake.clear_server_state = record  # type: ignore[method-assign]
    await beat.cleanup()
    assert cleared == [("host-a", 4242, "srv-1")]  # the keys of this server's records
    assert "srv-1" not in fake.servers
    await beat.tick()
    fake.fail("clear_server_state")
    with capture_logs() as logs:
        await beat.cleanup()  # logged, not raised
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("could not clear the server's state; it expires on its own", "warning")
    ]
    assert "srv-1" in fake.servers


# -- recoverer -----------------------------------------------------------------------------------


async def test_the_recoverer_logs_and_writes_each_expired_lease_with_its_reason() -> None:
    fake = FakeBroker(lease_duration=30)
    alive = fake.enqueue(message("a"))
    exhausted = fake.enqueue(message("b", retried=3))
    await fake.fetch([Q], 2)
    deps = role_deps(fake)
    rec = Recoverer(deps, 60.0, active=ActiveTasks())
    fake.advance(40)
    with capture_logs() as logs:
        await rec.tick()
    assert fake.tasks[exhausted.id].error == "asynq: task lease expired"
    assert fake.tasks[alive.id].msg.retried == 1
    events = {e["event"]: e for e in logs}
    archived = events["archiving task whose lease expired"]
    assert archived["log_level"] == "warning"
    assert (archived["task_id"], archived["task_type"], archived["queue"]) == (exhausted.id, "b", Q)
    retried = events["retrying task whose lease expired"]
    assert retried["log_level"] == "warning"
    assert (retried["task_id"], retried["task_type"], retried["queue"]) == (alive.id, "a", Q)
    assert retried["retry_in"] == 0.0  # an expired lease is retried at once by default


@pytest.mark.parametrize("retried", [0, 3], ids=["retry", "archive"])
async def test_the_recoverer_leaves_a_task_leased_again_since_its_scan(retried: int) -> None:
    # Two servers' recoverers wake at the same expiry; the first one's retry is fetched
    # by a worker at once. The second one's write must not take the task from that worker.
    fake = FakeBroker(lease_duration=30)
    msg = fake.enqueue(message(retried=retried))
    await fake.fetch([Q], 1)
    fake.advance(40)
    scan = fake.scan_leases

    async def scan_then_lease_again(
        cutoff: datetime, qnames: Sequence[str]
    ) -> tuple[list[tuple[str, TaskMessage]], float | None]:
        found = await scan(cutoff, qnames)
        fake.leases[msg.id] = fake.now + 30  # another worker holds it again
        return found

    fake.scan_leases = scan_then_lease_again  # type: ignore[method-assign]
    deps = role_deps(fake)
    await Recoverer(deps, 60.0, active=ActiveTasks()).tick()
    assert fake.state(msg.id) == "active"
    assert fake.leases[msg.id] == fake.now + 30
    assert fake.tasks[msg.id].msg.retried == retried
    assert deps.stats.recovered == 0


async def test_the_recoverer_uses_the_servers_retry_delay_and_is_failure() -> None:
    fake = FakeBroker(lease_duration=30)
    msg = fake.enqueue(message())
    await fake.fetch([Q], 1)
    seen: list[tuple[int, str, str, str | None]] = []

    def delay(n: int, exc: BaseException, task: Task) -> timedelta:
        seen.append((n, type(exc).__name__, task.type, task.id))
        return timedelta(seconds=90)

    deps = role_deps(fake, retry_delay=delay, is_failure=lambda exc: False)
    fake.advance(40)
    await Recoverer(deps, 60.0, active=ActiveTasks()).tick()
    assert seen == [(0, "LeaseExpiredError", "t", msg.id)]
    ((_, retry_at, err, is_failure),) = fake.called("retry")
    assert (retry_at, err, is_failure) == (fake.now + 90, "asynq: task lease expired", False)
    assert fake.state(msg.id) == "retry" and fake.tasks[msg.id].msg.retried == 0


async def test_a_raising_retry_delay_still_lets_the_recoverer_retry_the_task() -> None:
    fake = FakeBroker(lease_duration=30)
    msg = fake.enqueue(message())
    await fake.fetch([Q], 1)

    def broken(n: int, exc: BaseException, task: Task) -> timedelta:
        raise RuntimeError("bug")

    deps = role_deps(fake, retry_delay=broken)
    fake.advance(40)
    with capture_logs() as logs:
        await Recoverer(deps, 60.0, active=ActiveTasks()).tick()
    assert fake.state(msg.id) == "pending"  # asynq's default for a lost lease: at once
    assert deps.stats.recovered == 1
    (logged,) = [e for e in logs if e["event"] == "retry_delay raised; using the default delay"]
    assert (logged["log_level"], logged["task_id"]) == ("error", msg.id)
    assert (logged["task_type"], logged["queue"]) == ("t", Q)
    assert isinstance(logged["exc_info"], RuntimeError)  # the user's bug, with its traceback


async def test_a_recoverer_that_lost_the_race_waits_its_usual_interval() -> None:
    fake = FakeBroker(lease_duration=30)
    fake.enqueue(message())
    await fake.fetch([Q], 1)
    rec = Recoverer(role_deps(fake), 60.0, active=ActiveTasks())
    fake.advance(40)
    fake.fail("retry", TaskNotFoundError(Q, "x"))  # another server recovered it first
    await rec.tick()
    assert rec.next_wait == 30  # not the quick re-check of a task running here


async def test_a_message_naming_another_queue_is_archived_where_it_is_stored() -> None:
    fake = FakeBroker(lease_duration=30)
    msg = fake.enqueue(message())
    await fake.fetch([Q], 1)
    fake.advance(40)
    scan = fake.scan_leases

    async def stored_elsewhere(
        cutoff: datetime, qnames: Sequence[str]
    ) -> tuple[list[tuple[str, TaskMessage]], float | None]:
        found, earliest = await scan(cutoff, qnames)
        named = [(q, TaskMessage.parse(bytes(m))) for q, m in found]
        for _, m in named:
            m.queue = "elsewhere"
        return named, earliest

    fake.scan_leases = stored_elsewhere  # type: ignore[method-assign]
    deps = role_deps(fake)
    with capture_logs() as logs:
        await Recoverer(deps, 60.0, active=ActiveTasks()).tick()
    assert fake.state(msg.id) == "archived"
    ((tid, err),) = fake.called("archive")
    assert tid == msg.id
    assert err == (
        f"asyncq: task message names queue 'elsewhere' but is stored in queue {Q!r}; "
        "archived by the recoverer"
    )
    assert not fake.called("retry") and deps.stats.recovered == 1
    (logged,) = [e for e in logs if e["log_level"] == "error"]
    assert logged["event"] == "archiving task whose message names another queue"
    assert (logged["task_id"], logged["queue"]) == (msg.id, Q)


async def test_the_recoverer_checks_again_on_its_own_until_stopped() -> None:
    fake = FakeBroker(lease_duration=30)
    rec = Recoverer(role_deps(fake), 0.05, active=ActiveTasks())
    running = asyncio.create_task(rec.run())
    await wait_until(lambda: len(fake.called("scan_leases")) >= 3, what="three checks")
    rec.request_stop()
    await asyncio.wait_for(running, 5)


# -- lease ---------------------------------------------------------------------------------------


async def test_a_lease_is_valid_up_to_and_including_its_expiry_second() -> None:
    now = [129.0]
    lease = Lease(130.0, clock=lambda: now[0])
    assert not lease.expired.done()
    now[0] = 130.0
    assert lease.valid()  # asynq: the lease holds while its expiry is at or after now
    now[0] = 130.001
    assert not lease.valid() and not lease.expired.done()  # run out, not yet declared


async def test_a_lease_declared_expired_is_invalid_at_once_and_declared_once() -> None:
    lease = Lease(130.0, clock=lambda: 100.0)
    expired = lease.expired
    assert lease.extend(140.0) is True and lease.expires_at == 140.0
    assert lease.extend(135.0) is True and lease.expires_at == 140.0  # never shortened
    assert lease.expire() is True
    assert expired.done() and not lease.valid()  # 30 s left, but another server owns it
    assert not lease.extend(200.0) and lease.expires_at == 140.0
    assert lease.expire() is False
    assert lease.expired is expired  # one event, set once


async def test_a_queue_whose_extension_fails_leaves_the_next_queues_extended() -> None:
    fake = FakeBroker(lease_duration=30)
    first = Lease(fake.now + 10, clock=fake.clock)
    second = Lease(fake.now + 10, clock=fake.clock)
    fake.leases.update({"a1": fake.now + 10, "b1": fake.now + 10})
    fake.fail("extend_lease")
    failed = await extend_leases(
        fake,  # type: ignore[arg-type]
        {"a": [("a1", first)], "b": [("b1", second)]},
    )
    assert [(q, ids) for q, ids, _ in failed] == [("a", ["a1"])]
    assert first.expires_at == fake.now + 10  # kept its old expiry
    assert second.expires_at == fake.leases["b1"] == int(fake.now + 30)


# -- outcome and policy --------------------------------------------------------------------------


def test_is_failure_judges_the_exception_the_handler_raised() -> None:
    fake = FakeBroker()
    config = role_deps(fake, is_failure=lambda exc: isinstance(exc, ValueError)).config
    log = structlog.get_logger("test")
    m = message(id="x")
    failed = decide(m, ValueError("bad input"), lease="held", config=config, now=0.0, log=log)
    assert (failed.kind, failed.is_failure) == ("retry", True)
    other = decide(m, TimeoutError(), lease="held", config=config, now=0.0, log=log)
    assert (other.kind, other.is_failure) == ("retry", False)


def test_a_one_second_retention_keeps_the_task_and_a_revoked_step_tells_its_workflow() -> None:
    config = role_deps(FakeBroker()).config
    log = structlog.get_logger("test")
    kept = decide(message(retention=1), None, lease="held", config=config, now=0.0, log=log)
    assert kept.kind == "complete"
    headers = {WORKFLOW_HEADER: "wf", WORKFLOW_QUEUE_HEADER: Q, WORKFLOW_STEP_HEADER: "0.0"}
    revoked = decide(
        message(headers=headers), RevokeTask("gone"), lease="held", config=config, now=0.0, log=log
    )
    assert (revoked.kind, revoked.workflow, revoked.ack_mode) == ("revoke", True, "revoke")


@pytest.mark.parametrize(("drawn", "seconds"), [(0, 2**4 + 15), (29, 2**4 + 15 + 29 * 3)])
def test_asynqs_default_delay_at_both_ends_of_its_random_part(
    monkeypatch: pytest.MonkeyPatch, drawn: int, seconds: int
) -> None:
    bounds: list[int] = []

    def randrange(stop: int) -> int:
        bounds.append(stop)
        return drawn

    monkeypatch.setattr("asyncq._worker.policy.random.randrange", randrange)
    assert policy.default_retry_delay(2, ValueError(), Task("t")) == timedelta(seconds=seconds)
    assert bounds == [30]  # rand(30): 0 to 29 extra seconds per attempt


def test_a_raising_is_failure_counts_a_failure_and_is_logged() -> None:
    def broken(exc: BaseException) -> bool:
        raise RuntimeError("bug")

    config = role_deps(FakeBroker(), is_failure=broken).config
    m = message(id="x")
    with capture_logs() as logs:
        out = decide(
            m, ValueError("v"), lease="held", config=config, now=0.0, log=structlog.get_logger("t")
        )
    assert (out.kind, out.is_failure) == ("retry", True)
    (logged,) = [e for e in logs if e["event"] == "is_failure raised; counting a failure"]
    assert logged["log_level"] == "error" and isinstance(logged["exc_info"], RuntimeError)
    assert (logged["task_id"], logged["task_type"], logged["queue"]) == ("x", "t", Q)


# -- processor -----------------------------------------------------------------------------------


def _debugging(run: Running) -> Running:
    """The processor as with structlog configured at DEBUG: its per-task debug events on."""
    attempts = run.processor.attempts
    run.processor._debug = attempts._debug = attempts.writer._debug = True
    return run


def _events(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == event]


async def test_a_type_out_of_tokens_is_put_back_unrun_for_its_buckets_wait() -> None:
    fake = FakeBroker()
    msgs = [fake.enqueue(message("api")) for _ in range(2)]
    fake.tokens["api"] = 0
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")

    run = _debugging(Running(fake, handler, limits=Limits(type_rate_limits={"api": "10/s"})))
    history = run.processor.attempts.writer.history = _History()  # type: ignore[assignment]
    progress = run.processor.attempts._progress = _Progress()  # type: ignore[assignment]
    with capture_logs() as logs:
        async with run:
            await wait_until(
                lambda: all(fake.state(m.id) == "retry" for m in msgs), what="rescheduled"
            )
    assert ran == [] and history.runs == [] and progress.ends == []  # not run, not counted
    assert {t for t, _ in fake.called("take_type_tokens")} == {"api"}
    for m in msgs:
        stored = fake.tasks[m.id]
        assert stored.score == pytest.approx(fake.now + 0.1)  # 10/s: a token every 100 ms
        assert stored.msg.retried == 0
        assert stored.error == "asyncq: rate limit of task type 'api' (10/s) reached; not run"
    assert run.processor.stats.type_rate_limited == 2
    logged = _events(logs, "task type over its rate limit; rescheduled")
    assert sorted(e["task_id"] for e in logged) == sorted(m.id for m in msgs)
    for e in logged:
        assert (e["log_level"], e["task_type"], e["queue"]) == ("debug", "api", Q)
        assert (e["rate"], e["retry_in"]) == ("10/s", str(timedelta(milliseconds=100)))


async def test_a_failed_type_token_call_is_logged_with_the_task() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message("api"))
    fake.fail("take_type_tokens")

    with capture_logs() as logs:
        async with Running(fake, _returns, limits=Limits(type_rate_limits={"api": "10/s"})):
            await wait_until(lambda: fake.state(msg.id) == "retry", what="rescheduled")
    (logged,) = _events(
        logs, "could not take a token of the task type's rate limit; rescheduling the task"
    )
    assert logged["log_level"] == "warning"
    assert logged["error"] == "ConnectionError: fake take_type_tokens failed"
    assert logged["suppressed_since_last"] == 0
    assert (logged["task_id"], logged["task_type"], logged["queue"]) == (msg.id, "api", Q)


async def test_the_type_token_call_carries_the_types_rate_for_the_whole_fetch() -> None:
    fake = FakeBroker()
    msgs = [fake.enqueue(message("api")) for _ in range(3)]
    asked: list[tuple[str, int, dict[str, int]]] = []
    take = fake.take_type_tokens

    async def record(task_type: str, count: int, **kw: int) -> tuple[list[int], int]:
        asked.append((task_type, count, kw))
        return await take(task_type, count, **kw)

    fake.take_type_tokens = record  # type: ignore[method-assign]
    async with Running(
        fake, _returns, concurrency=3, limits=Limits(type_rate_limits={"api": "10/s burst 2"})
    ):
        await wait_until(lambda: not fake.tasks, what="all done")
    want = {"interval_us": 100_000, "burst": 2, "max_wait_us": TYPE_RATE_MAX_WAIT_US}
    assert asked == [("api", 3, want)]  # the three tasks of one fetch ask in one call
    assert fake.processed == len(msgs)


async def test_a_failed_fetch_is_counted_once_and_logged() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    fake.fail("fetch")
    with capture_logs() as logs:
        async with Running(fake, _returns) as run:
            await wait_until(lambda: msg.id not in fake.tasks, what="done after the failure")
    assert run.processor.stats.fetch_errors == 1
    (logged,) = _events(logs, "could not dequeue tasks")
    assert logged["log_level"] == "error"
    assert logged["error"] == "ConnectionError: fake fetch failed"
    assert logged["suppressed_since_last"] == 0


async def test_an_orphaned_handler_is_logged_with_its_grace_and_its_stop_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(active_module, "CANCEL_GRACE", 0.1)
    fake = FakeBroker()
    msg = fake.enqueue(message())
    started = asyncio.Event()
    resume = asyncio.Event()

    async def stubborn(task: Task) -> None:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        await resume.wait()

    with capture_logs() as logs:
        async with Running(fake, stubborn) as run:
            await asyncio.wait_for(started.wait(), 5)
            assert run.active.cancel(msg.id, DeadlineExceededError()) is not None
            await wait_until(lambda: fake.state(msg.id) == "retry", what="failure written")
            (orphan,) = run.processor.orphans
        resume.set()
        await asyncio.wait_for(orphan, 5)
    (logged,) = [e for e in logs if e["log_level"] == "error"]
    assert logged["event"].startswith("handler ignored its cancellation")
    assert logged["grace"] == 0.1  # the cancel grace, not the shutdown's shorter wait
    assert logged["error"] == "context deadline exceeded"
    assert (logged["task_id"], logged["task_type"], logged["queue"]) == (msg.id, "t", Q)


class _Hooks(NoWorkerHooks):
    """Records the processor's lease_expired, task_retried and task_archived calls, and its
    task_finished calls apart."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.finished: list[tuple[Any, ...]] = []

    def lease_expired(self, queue: str, task_type: str) -> None:
        self.calls.append(("lease_expired", queue, task_type))

    def task_retried(self, queue: str, task_type: str) -> None:
        self.calls.append(("task_retried", queue, task_type))

    def task_archived(self, queue: str, task_type: str) -> None:
        self.calls.append(("task_archived", queue, task_type))

    def task_finished(
        self,
        queue: str,
        task_type: str,
        task_id: str,
        outcome: str,
        *,
        error: str = "",
        exc: BaseException | None = None,
    ) -> None:
        self.finished.append((queue, task_type, task_id, outcome, error, exc))


@pytest.mark.parametrize(
    ("raised", "event"),
    [
        (None, "task finished after its lease expired; not writing its outcome, the recoverer "
               "will retry it"),
        (ValueError("late"), "task lease expired; not writing its outcome, the recoverer will "
                             "retry it"),
    ],
    ids=["returned", "raised"],
)  # fmt: skip
async def test_a_handler_ending_after_its_lease_ran_out_is_left_to_the_recoverer(
    raised: BaseException | None, event: str
) -> None:
    fake = FakeBroker(lease_duration=30)
    msg = fake.enqueue(message())
    started = asyncio.Event()
    gate = asyncio.Event()

    async def handler(task: Task) -> None:
        started.set()
        await gate.wait()
        if raised is not None:
            raise raised

    run = Running(fake, handler)
    hooks = run.processor.attempts.writer.hooks = _Hooks()
    with capture_logs() as logs:
        async with run:
            await asyncio.wait_for(started.wait(), 5)
            fake.advance(31)  # the lease ran out; no heartbeat has declared it yet
            gate.set()
            await wait_until(lambda: not run.active, what="released")
    assert fake.state(msg.id) == "active"  # nothing written
    assert hooks.calls == [("lease_expired", Q, "t")]
    (logged,) = _events(logs, event)
    assert logged["log_level"] == "warning"
    assert (logged["task_id"], logged["task_type"], logged["queue"]) == (msg.id, "t", Q)
    assert not _events(logs, "task bookkeeping failed")


async def test_a_lease_declared_expired_mid_handler_is_reported_once() -> None:
    fake = FakeBroker(lease_duration=30)
    msgs = [fake.enqueue(message()) for _ in range(2)]
    started: list[str] = []

    async def handler(task: Task) -> None:
        started.append(task.id or "")
        await asyncio.sleep(3600)

    run = _debugging(Running(fake, handler, concurrency=2))
    hooks = run.processor.attempts.writer.hooks = _Hooks()
    with capture_logs() as logs:
        async with run:
            await wait_until(lambda: len(started) == 2, what="both running")
            fake.advance(31)
            for msg in msgs:
                assert run.active[msg.id].lease.expire()
            await wait_until(lambda: not run.active, what="released")
    assert run.processor.stats.failed == 2
    # Reported by the failure report, not again when the outcome is dropped.
    assert hooks.calls == [("lease_expired", Q, "t")] * 2
    ids = sorted(m.id for m in msgs)
    cancelling = _events(logs, "lease expired; cancelling handler")
    assert sorted(e["task_id"] for e in cancelling) == ids
    for e in cancelling:
        assert (e["log_level"], e["task_type"], e["queue"]) == ("debug", "t", Q)
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert {e["event"] for e in warned} == {"task lease expired; handler cancelled"}
    assert sorted(e["task_id"] for e in warned) == ids
    assert all((e["task_type"], e["queue"]) == ("t", Q) for e in warned)


async def test_a_lease_declared_expired_while_the_outcome_is_written_cancels_nothing() -> None:
    fake = FakeBroker(lease_duration=30)
    msg = fake.enqueue(message())
    write = fake.hold("retry")
    run = _debugging(Running(fake, _fails))
    with capture_logs() as logs:
        async with run:
            await asyncio.wait_for(write.arrived.wait(), 5)
            assert run.active[msg.id].lease.expire()  # the handler has already returned
            write.release.set()
            await wait_until(lambda: not run.active, what="released")
    assert not _events(logs, "lease expired; cancelling handler")


class _Deferred:
    """The writes handed to the syncer, with the deadline and message they were given."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, float, TaskMessage]] = []

    def __call__(self, write: Any, *, deadline: float, what: str, msg: TaskMessage) -> None:
        self.writes.append((what, deadline, msg))


async def test_a_write_for_the_syncer_keeps_its_lease_deadline_and_is_logged() -> None:
    fake = FakeBroker(lease_duration=30)
    msg = fake.enqueue(message())
    fake.fail("retry")
    run = Running(fake, _fails)
    deferred = run.processor.attempts.writer.defer_write = _Deferred()
    with capture_logs() as logs:
        async with run:
            await wait_until(lambda: deferred.writes, what="write deferred")
    # The syncer may write it until the lease runs out (Redis keeps it in whole seconds).
    assert deferred.writes == [("retry", int(fake.now + 30), msg)]
    (logged,) = _events(logs, "could not write task outcome; the syncer will retry it")
    assert logged["log_level"] == "warning"
    assert (logged["outcome"], logged["error"]) == ("retry", "ConnectionError: fake retry failed")
    assert logged["suppressed_since_last"] == 0
    assert (logged["task_id"], logged["task_type"], logged["queue"]) == (msg.id, "t", Q)


async def test_a_write_redis_refuses_is_logged_and_not_handed_to_the_syncer() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    fake.fail("retry", ResponseError("ERR refused"))
    with capture_logs() as logs:
        async with Running(fake, _fails) as run:
            await wait_until(lambda: fake.called("retry") and not run.active, what="refused")
    assert not run.deferred.writes  # an error reply would be refused again
    (logged,) = _events(logs, "task outcome rejected by Redis")
    assert logged["log_level"] == "error"
    assert (logged["outcome"], logged["error"]) == ("retry", "ResponseError: ERR refused")
    assert (logged["task_id"], logged["task_type"], logged["queue"]) == (msg.id, "t", Q)


async def test_an_error_handler_cancelling_itself_after_a_cancel_message_still_writes() -> None:
    # The cancel message's cancellation of the task's coroutine was handled (uncancelled):
    # a CancelledError the error handler raises afterwards is its own, not a loop shutdown.
    fake = FakeBroker()
    msg = fake.enqueue(message())
    started = asyncio.Event()
    seen: list[str] = []

    async def handler(task: Task) -> None:
        started.set()
        await asyncio.sleep(3600)

    def on_error(task: Task, exc: BaseException) -> None:
        seen.append(str(exc))
        raise asyncio.CancelledError

    with capture_logs() as logs:
        async with Running(fake, handler, error_handler=on_error) as run:
            await asyncio.wait_for(started.wait(), 5)
            assert run.active.cancel(msg.id, TaskCanceledError()) is not None
            await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
    assert seen == ["context canceled"]
    assert fake.tasks[msg.id].error == "context canceled"
    (logged,) = [e for e in logs if e["log_level"] == "error"]
    assert logged["event"] == "error_handler raised"
    assert isinstance(logged["exc_info"], asyncio.CancelledError)
    assert (logged["task_id"], logged["task_type"], logged["queue"]) == (msg.id, "t", Q)


async def test_a_workflow_step_failing_for_good_is_archived_with_its_error() -> None:
    fake = FakeBroker()
    headers = {WORKFLOW_HEADER: "wf", WORKFLOW_QUEUE_HEADER: Q, WORKFLOW_STEP_HEADER: "0.0"}
    msg = fake.enqueue(message(headers=headers, retried=3))
    run = _debugging(Running(fake, _fails))
    with capture_logs() as logs:
        async with run:
            await wait_until(lambda: fake.state(msg.id) == "archived", what="archived")
    assert fake.called("ack_workflow_step") == [(msg.id, "archive")]
    (acked,) = _events(logs, "workflow step acknowledged")
    assert (acked["log_level"], acked["workflow_state"]) == ("debug", "running")
    assert (acked["task_id"], acked["task_type"], acked["queue"]) == (msg.id, "t", Q)
    assert fake.tasks[msg.id].error == "ValueError: boom"
    assert run.notifier.sent == [msg.id]  # result waiters learn of the archive


async def _raise_revoke(task: Task) -> None:
    raise RevokeTask("gone")


async def test_revoked_tasks_count_as_successes_and_are_logged() -> None:
    fake = FakeBroker()
    msgs = [fake.enqueue(message()) for _ in range(2)]
    with capture_logs() as logs:
        async with Running(fake, _raise_revoke, concurrency=2) as run:
            await wait_until(lambda: not fake.tasks, what="deleted")
    assert (run.processor.stats.succeeded, run.processor.stats.failed) == (2, 0)
    revoked = _events(logs, "task revoked")
    assert sorted(e["task_id"] for e in revoked) == sorted(m.id for m in msgs)
    assert all((e["log_level"], e["task_type"], e["queue"]) == ("info", "t", Q) for e in revoked)


async def test_a_failure_is_counted_and_only_an_unexpected_one_logs_its_traceback() -> None:
    fake = FakeBroker()
    bad = fake.enqueue(message("bad", retried=1))
    skip = fake.enqueue(message("skip"))
    raised: dict[str, BaseException] = {}

    async def handler(task: Task) -> None:
        exc = ValueError("boom") if task.type == "bad" else SkipRetry("no")
        raised[task.type] = exc
        raise exc

    with capture_logs() as logs:
        async with Running(fake, handler, concurrency=2) as run:
            await wait_until(
                lambda: fake.state(bad.id) == "retry" and fake.state(skip.id) == "archived",
                what="written",
            )
    assert (run.processor.stats.failed, run.processor.stats.succeeded) == (2, 0)
    failed = {e["task_type"]: e for e in _events(logs, "task failed")}
    assert failed["bad"]["exc_info"] is raised["bad"]  # a bug: its traceback
    assert failed["skip"]["exc_info"] is None  # asked for: one line
    assert failed["bad"]["log_level"] == failed["skip"]["log_level"] == "warning"
    assert (failed["bad"]["error"], failed["bad"]["retried"], failed["bad"]["max_retry"]) == (
        "ValueError: boom",
        1,
        3,
    )
    assert (failed["bad"]["task_id"], failed["bad"]["queue"]) == (bad.id, Q)


async def test_a_rate_limited_handler_is_logged_once_and_not_a_failure() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    reported: list[BaseException] = []

    async def limited(task: Task) -> None:
        raise RateLimited(timedelta(seconds=30))

    with capture_logs() as logs:
        async with Running(fake, limited, error_handler=lambda t, e: reported.append(e)) as run:
            await wait_until(lambda: fake.state(msg.id) == "retry", what="rescheduled")
    assert reported == []  # not a failure: the error handler is not told
    assert run.processor.stats.failed == 0
    (logged,) = _events(logs, "task rate limited; rescheduled")
    assert (logged["log_level"], logged["retry_in"]) == ("info", "0:00:30")
    assert (logged["task_id"], logged["task_type"], logged["queue"]) == (msg.id, "t", Q)
    assert not _events(logs, "task failed")


async def test_a_lost_lease_is_a_failure_whatever_it_was_raised_from() -> None:
    # A lease that ran out is never a rate limit, even chained from one: the attempt
    # counts, is told to the error handler and uses a retry.
    fake = FakeBroker()
    msg = fake.enqueue(message())
    reported: list[BaseException] = []

    async def handler(task: Task) -> None:
        try:
            raise RateLimited(timedelta(seconds=30))
        except RateLimited as limited:
            raise LeaseExpiredError("lease lost") from limited

    async with Running(fake, handler, error_handler=lambda t, e: reported.append(e)) as run:
        await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
    assert [type(e) for e in reported] == [LeaseExpiredError]
    assert run.processor.stats.failed == 1
    assert fake.tasks[msg.id].msg.retried == 1


async def test_retry_delay_gets_the_task_the_handler_ran() -> None:
    # The same object, with its result writer: a delay may depend on what the handler did.
    fake = FakeBroker()
    msg = fake.enqueue(message())
    ran: list[Task] = []
    seen: list[Task] = []

    async def handler(task: Task) -> None:
        ran.append(task)
        raise ValueError("boom")

    def delay(n: int, exc: BaseException, task: Task) -> timedelta:
        seen.append(task)
        return timedelta(seconds=5)

    async with Running(fake, handler, retry_delay=delay):
        await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
    assert len(seen) == 1 and seen[0] is ran[0]
    assert seen[0].result_writer is not None


async def test_a_failed_acknowledgement_of_a_kept_task_is_retried_as_its_completion() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message(retention=60))
    fake.fail("ack_many")
    async with Running(fake, _returns) as run:
        await wait_until(lambda: run.deferred.writes, what="write deferred")
        ((what, write),) = run.deferred.writes
        assert what == "done"
        await write()  # what the syncer does once Redis answers again
    assert fake.called("mark_as_complete") == [msg.id] and not fake.called("done")
    assert fake.state(msg.id) == "completed"


async def test_the_debug_lines_of_a_wake_up_and_of_a_tasks_start_and_end() -> None:
    fake = FakeBroker()
    run = _debugging(Running(fake, _returns, intervals=Intervals(task_check=timedelta(seconds=60))))
    with capture_logs() as logs:
        async with run:
            await wait_until(lambda: fake.called("fetch"), what="first fetch")
            await wait_until(lambda: run.processor.stats.empty_fetches, what="idle")
            msg = fake.enqueue(message())
            run.processor._wakeup.set()  # what the subscriber does on a wake-up message
            await wait_until(lambda: msg.id not in fake.tasks, what="done")
    assert run.processor.stats.wakeups == 1 and run.processor.stats.idle_timeouts == 0
    (woken,) = _events(logs, "woken up: a queue has work")
    assert woken["log_level"] == "debug"
    for event in ("task started", "task done"):
        (logged,) = _events(logs, event)
        assert logged["log_level"] == "debug"
        assert (logged["task_id"], logged["task_type"], logged["queue"]) == (msg.id, "t", Q)


_STEP = {WORKFLOW_HEADER: "wf", WORKFLOW_QUEUE_HEADER: Q, WORKFLOW_STEP_HEADER: "0.0"}


@pytest.mark.parametrize(
    ("handler", "fields", "method", "what"),
    [
        (_fails, {"retried": 3, "headers": _STEP}, "ack_workflow_step", "archive"),
        (_raise_revoke, {"headers": _STEP}, "ack_workflow_step", "done"),
        (_raise_revoke, {}, "done", "done"),
        (_fails, {"retried": 3}, "archive", "archive"),
    ],
    ids=["step archived", "step revoked", "revoked", "archived"],
)
async def test_each_outcomes_lost_write_reaches_the_syncer_named_by_its_outcome(
    handler: Any, fields: dict[str, Any], method: str, what: str
) -> None:
    fake = FakeBroker(lease_duration=30)
    msg = fake.enqueue(message(**fields))
    fake.fail(method)
    run = Running(fake, handler)
    deferred = run.processor.attempts.writer.defer_write = _Deferred()
    with capture_logs() as logs:
        async with run:
            await wait_until(lambda: deferred.writes, what="write deferred")
    assert deferred.writes == [(what, int(fake.now + 30), msg)]
    (logged,) = _events(logs, "could not write task outcome; the syncer will retry it")
    assert (logged["outcome"], logged["task_id"]) == (what, msg.id)


@pytest.mark.parametrize(
    ("handler", "fields", "state", "error"),
    [
        (_fails, {"retried": 3}, "archived", "ValueError: boom"),
        (_returns, {"retention": 60}, "completed", ""),
    ],
    ids=["archived", "completed"],
)
async def test_a_kept_outcome_is_stored_and_its_result_waiters_told_on_its_queue(
    handler: Any, fields: dict[str, Any], state: str, error: str
) -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message(**fields))
    async with Running(fake, handler) as run:
        await wait_until(lambda: fake.state(msg.id) == state, what=state)
        await wait_until(lambda: run.notifier.sent, what="waiters told")
    assert fake.tasks[msg.id].error == error
    assert (run.notifier.sent, run.notifier.queues) == ([msg.id], [Q])


async def test_a_raising_retry_delay_in_the_processor_is_logged_and_the_task_retried() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())

    def broken(n: int, exc: BaseException, task: Task) -> timedelta:
        raise RuntimeError("bug")

    with capture_logs() as logs:
        async with Running(fake, _fails, retry_delay=broken):
            await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
    (logged,) = _events(logs, "retry_delay raised; using the default delay")
    assert (logged["log_level"], logged["task_id"]) == ("error", msg.id)
    assert isinstance(logged["exc_info"], RuntimeError)


class _History:
    """Records what the processor counts in the metrics history."""

    def __init__(self) -> None:
        self.runs: list[tuple[Any, ...]] = []

    def record(self, *run: Any) -> None:
        self.runs.append(run)


@pytest.mark.parametrize(
    ("handler", "fields", "flags", "hook"),
    [
        (_returns, {}, (False, False, False), None),
        (_fails, {}, (True, True, False), "task_retried"),
        (_rate_limited_handler, {}, (True, False, False), None),
        (_fails, {"retried": 3}, (True, False, True), "task_archived"),
    ],
    ids=["done", "retried", "rate limited", "archived"],
)
async def test_the_history_counts_each_run_with_what_was_decided_for_it(
    handler: Any, fields: dict[str, Any], flags: tuple[bool, bool, bool], hook: str | None
) -> None:
    # failed: the handler raised; retried: a retry that is not a rate limit; archived.
    fake = FakeBroker()
    msg = fake.enqueue(message(**fields))
    run = Running(fake, handler)
    history = run.processor.attempts.writer.history = _History()  # type: ignore[assignment]
    hooks = run.processor.attempts.writer.hooks = _Hooks()
    async with run:
        await wait_until(lambda: history.runs and not run.active, what="counted")
    ((queue, task_type, began, ended, *decided),) = history.runs
    assert (queue, task_type, tuple(decided)) == (Q, "t", flags)
    assert began == ended == fake.now  # the fake clock stands still
    assert hooks.calls == ([(hook, Q, "t")] if hook else [])
    assert fake.tasks.get(msg.id) is None or fake.state(msg.id) != "active"


async def test_task_finished_is_told_the_task_its_outcome_and_the_exception() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    raised: list[BaseException] = []

    async def handler(task: Task) -> None:
        err = ValueError("boom")
        raised.append(err)
        raise err

    run = Running(fake, handler)
    hooks = run.processor.attempts.writer.hooks = _Hooks()
    async with run:
        await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
    assert hooks.finished == [(Q, "t", msg.id, "retry", "ValueError: boom", raised[0])]


async def test_an_async_error_handler_is_awaited_with_the_task_and_its_failure_logged() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    seen: list[tuple[str | None, str]] = []

    async def on_error(task: Task, exc: BaseException) -> None:
        await asyncio.sleep(0)
        seen.append((task.id, str(exc)))
        raise KeyError("handler bug")

    with capture_logs() as logs:
        async with Running(fake, _fails, error_handler=on_error):
            await wait_until(lambda: fake.state(msg.id) == "retry", what="retried")
    assert seen == [(msg.id, "boom")]
    (logged,) = _events(logs, "error_handler raised")
    assert isinstance(logged["exc_info"], KeyError)
    assert (logged["task_id"], logged["task_type"], logged["queue"]) == (msg.id, "t", Q)


async def test_a_task_cancelled_from_outside_in_its_error_handler_writes_nothing() -> None:
    # A loop shutdown cancels the task's coroutine: not the error handler's own failure.
    fake = FakeBroker()
    msg = fake.enqueue(message())
    entered = asyncio.Event()

    async def on_error(task: Task, exc: BaseException) -> None:
        entered.set()
        await asyncio.sleep(3600)

    with capture_logs() as logs:
        async with Running(fake, _fails, error_handler=on_error) as run:
            await asyncio.wait_for(entered.wait(), 5)
            task = run.active[msg.id].task
            assert task is not None
            task.cancel()
            await wait_until(lambda: not run.active, what="released")
    assert fake.state(msg.id) == "active"  # left to the recoverer
    assert not _events(logs, "error_handler raised")
    assert not fake.called("retry")


async def test_an_archived_task_is_logged_with_its_error() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message(retried=3))
    with capture_logs() as logs:
        async with Running(fake, _fails):
            await wait_until(lambda: fake.state(msg.id) == "archived", what="archived")
    (logged,) = _events(logs, "task archived")
    assert (logged["log_level"], logged["error"]) == ("warning", "ValueError: boom")
    assert (logged["task_id"], logged["task_type"], logged["queue"]) == (msg.id, "t", Q)


class _Held:
    """A handler that records each task it starts and returns once ``finish`` is set."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finish = asyncio.Event()

    async def __call__(self, task: Task) -> None:
        self.started.append(task.id or "")
        await self.finish.wait()


async def test_the_idle_wait_counts_each_timeout_and_each_wake_up() -> None:
    processor = Running(FakeBroker(), _returns).processor
    await processor._idle_wait(0.001, count=True)
    await processor._idle_wait(0.001, count=True)
    await processor._idle_wait(0.001, count=False)
    processor._wakeup.set()
    await processor._idle_wait(5, count=True)
    await processor._idle_wait(5, count=True)
    await processor._idle_wait(5, count=False)
    assert (processor.stats.idle_timeouts, processor.stats.wakeups) == (2, 2)


async def test_shutdown_waits_for_a_handler_that_returns_within_its_grace() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    handler = _Held()

    with capture_logs() as logs:
        async with Running(fake, handler) as run:
            await wait_until(lambda: handler.started, what="started")
            drain = asyncio.create_task(run.processor.drain(30))
            await wait_until(lambda: _events(logs, "waiting for running tasks"), what="waiting")
            handler.finish.set()
            await asyncio.wait_for(drain, 5)
    assert msg.id not in fake.tasks and not fake.called("requeue")  # done, not requeued
    (logged,) = _events(logs, "waiting for running tasks")
    assert (logged["log_level"], logged["count"], logged["timeout"]) == ("info", 1, 30)


@pytest.mark.parametrize(("forced", "grace"), [(False, 1.0), (True, 0.1)])
async def test_a_handler_stopped_by_shutdown_gets_a_second_or_a_forced_tenth(
    forced: bool, grace: float
) -> None:
    # After the shutdown's grace the handler is cancelled; one that ignores it is left
    # behind after 1 s, or after 0.1 s once a second signal forced the shutdown.
    fake = FakeBroker()
    fake.enqueue(message())
    started = asyncio.Event()
    release = asyncio.Event()

    async def stubborn(task: Task) -> None:
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    force = asyncio.Event()
    if forced:
        force.set()
    with capture_logs() as logs:
        async with Running(fake, stubborn) as run:
            await asyncio.wait_for(started.wait(), 5)
            await run.processor.drain(0.01, force=force)
            orphans = list(run.processor.orphans)
            release.set()
            await asyncio.gather(*orphans)
    (logged,) = [e for e in logs if e["event"].startswith("handler ignored its cancellation")]
    assert logged["grace"] == grace
    (left,) = _events(logs, "handlers ignored cancellation; leaving them")
    assert (left["log_level"], left["count"]) == ("warning", 1)


async def test_shutdown_requeues_tasks_whose_coroutines_have_not_started_yet() -> None:
    fake = FakeBroker(lease_duration=30)
    msgs = [fake.enqueue(message()) for _ in range(2)]
    processor = Running(fake, _returns).processor
    starting: list[ActiveTask] = []
    for dequeued in (await fake.fetch([Q], 2)).tasks:  # fetched, their coroutines not yet run
        lease = Lease(math.floor(dequeued.lease_expiry), clock=fake.clock)
        active = ActiveTask(dequeued.message, lease, fake.now + 60, fake.now)
        processor.active[active.msg.id] = active
        starting.append(active)

    with capture_logs() as logs:
        await processor.drain(0)

    ids = [m.id for m in msgs]
    assert fake.called("requeue") == ids and processor.stats.requeued == 2
    assert all(fake.state(i) == "pending" for i in ids)
    assert all(a.abandoned and isinstance(a.cancel_exc, asyncio.CancelledError) for a in starting)
    requeued = _events(logs, "quitting worker; requeueing task")
    assert [(e["log_level"], e["task_id"], e["queue"]) for e in requeued] == [
        ("info", i, Q) for i in ids
    ]


async def test_a_forced_shutdown_does_not_wait_for_an_outcome_redis_holds_forever() -> None:
    fake = FakeBroker()
    fake.enqueue(message())
    held = fake.hold("retry")
    force = asyncio.Event()
    force.set()
    async with Running(fake, _fails) as run:
        await asyncio.wait_for(held.arrived.wait(), 5)
        await asyncio.wait_for(run.processor.drain(0.01, force=force), 10)  # returns, no error
        held.release.set()


async def test_each_fetch_carries_the_servers_order_and_what_room_is_left() -> None:
    # The byte budget left, whether a task already runs (first_free), the limits.
    fake = FakeBroker()
    first = fake.enqueue(message(payload=b"x" * 100))
    handler = _Held()

    options = {"queues": {Q: 1}, "strict_priority": True}
    async with Running(
        fake,
        handler,
        concurrency=2,
        **options,
        limits=Limits(max_inflight_bytes=1000, queue_concurrency={Q: 5}),
    ) as run:
        await wait_until(lambda: handler.started, what="started")
        second = fake.enqueue(message(payload=b"y" * 10))
        run.processor._wakeup.set()
        await wait_until(lambda: second.id not in fake.pending[Q], what="second fetched")
        handler.finish.set()
    one, two = fake.fetches[:2]
    # half the slots per fetch (the next fetch overlaps the last batch's acknowledgements)
    assert (one["queues"], one["count"], one["strict"]) == ([Q], 1, True)
    assert (one["max_bytes"], one["first_free"]) == (1000, True)
    assert one["limits"] == two["limits"] == {Q: (5, -1)}
    assert (two["count"], two["max_bytes"], two["first_free"]) == (1, 900, False)
    assert first.id != second.id


async def test_a_task_running_does_not_keep_the_next_from_starting_under_the_byte_bound() -> None:
    fake = FakeBroker()
    fake.enqueue(message())
    handler = _Held()

    async with Running(fake, handler, concurrency=2) as run:
        await wait_until(lambda: len(handler.started) == 1, what="first started")
        fake.enqueue(message())
        run.processor._wakeup.set()
        await wait_until(lambda: len(handler.started) == 2, what="second started beside it")
        handler.finish.set()


async def test_a_full_byte_bound_fetches_nothing_until_a_task_ends() -> None:
    fake = FakeBroker()
    fake.enqueue(message(payload=b"x" * 100))
    handler = _Held()

    async with Running(fake, handler, concurrency=2, limits=Limits(max_inflight_bytes=100)) as run:
        await wait_until(lambda: len(handler.started) == 1, what="first started")
        fetches = len(fake.fetches)
        fake.enqueue(message(payload=b"y"))
        run.processor._wakeup.set()
        for _ in range(20):  # the fetch loop's turns: it waits for freed bytes instead
            await asyncio.sleep(0)
        assert len(fake.fetches) == fetches and len(handler.started) == 1
        handler.finish.set()
        await wait_until(lambda: len(handler.started) == 2, what="second started after")


async def test_a_burst_processor_ends_once_the_queues_are_empty() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    done: list[bool] = []
    run = Running(fake, _returns, burst=True)
    run.processor._on_burst_done = lambda: done.append(True)
    with capture_logs() as logs:
        async with run:
            await wait_until(lambda: done, what="burst done")
    assert msg.id not in fake.tasks and done == [True]
    assert _events(logs, "burst mode: queues are empty, shutting down")


async def test_failed_fetches_count_as_errors_not_as_idle_timeouts() -> None:
    fake = FakeBroker()
    fake.down()
    async with Running(fake, _returns) as run:
        await wait_until(lambda: run.processor.stats.fetch_errors >= 2, what="two failures")
    assert run.processor.stats.idle_timeouts == run.processor.stats.empty_fetches == 0


async def test_one_empty_fetch_is_counted_once() -> None:
    fake = FakeBroker()
    async with Running(
        fake, _returns, intervals=Intervals(task_check=timedelta(seconds=60))
    ) as run:
        await wait_until(lambda: run.processor.stats.empty_fetches, what="idle")
        for _ in range(20):
            await asyncio.sleep(0)
        assert run.processor.stats.empty_fetches == 1


async def test_plain_def_handlers_share_the_servers_sync_concurrency() -> None:
    fake = FakeBroker()
    for _ in range(3):
        fake.enqueue(message())
    lock = threading.Lock()
    running = [0, 0]  # now, most at once

    def handler(task: Task) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        threading.Event().wait(0.05)
        with lock:
            running[0] -= 1

    mux = ServeMux()
    mux.handle("t", handler)
    async with Running(fake, mux, concurrency=3, limits=Limits(sync_concurrency=1)):
        await wait_until(lambda: not fake.tasks, what="all ran")
    assert running[1] == 1


async def test_a_task_stopped_before_its_handler_ran_is_not_counted_in_the_history() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message(deadline=int(fake.now) - 1))  # its deadline passed in the queue
    run = Running(fake, _returns)
    history = run.processor.attempts.writer.history = _History()  # type: ignore[assignment]
    async with run:
        await wait_until(lambda: fake.state(msg.id) == "retry", what="retried unrun")
    assert history.runs == []
    assert fake.tasks[msg.id].error == "context deadline exceeded"


async def test_a_burst_processor_waits_for_its_running_task_before_it_ends() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message())
    handler = _Held()

    done: list[bool] = []
    run = Running(
        fake, handler, burst=True, concurrency=2, intervals=Intervals(task_check=timedelta(hours=1))
    )
    run.processor._on_burst_done = lambda: done.append(True)
    async with run:
        await wait_until(lambda: handler.started, what="started")
        await wait_until(lambda: run.processor.stats.empty_fetches, what="an empty fetch")
        assert not done  # a task still runs: its outcome may enqueue more work
        handler.finish.set()
        await wait_until(lambda: done, what="burst done once the task ended")  # not an hour
    assert msg.id not in fake.tasks


async def test_a_queue_held_by_a_limit_is_polled_even_while_key_tracking_is_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No invalidation announces room under a limit: the poll interval, not tracking's.
    from asyncq._worker import wakeup

    monkeypatch.setattr(wakeup, "TRACKED_POLL", 3600.0)
    fake = FakeBroker()
    fake.held.add(Q)
    run = Running(fake, _returns, intervals=Intervals(task_check=timedelta(milliseconds=200)))
    run.processor._wakeup.tracking = True
    async with run:
        await wait_until(lambda: len(fake.fetches) >= 3, what="polled fetches")


async def test_a_pattern_matching_no_queue_yet_fetches_from_none() -> None:
    fake = FakeBroker()
    async with Running(fake, _returns, queues={"tenant-*": 1}) as run:
        await wait_until(lambda: fake.fetches, what="a fetch")
        assert fake.fetches[0]["queues"] == []
        assert run.processor.stats.fetch_errors == 0


def test_the_queues_a_pattern_matches_share_its_weight_in_the_draw() -> None:
    # x and the pattern have the same priority; the pattern's nine queues split its
    # weight, so x comes first about half the time (1 in 10 if each counted whole).
    run = Running(FakeBroker(), _returns, queues={"x": 1, "p-*": 1})
    served = run.deps.queues
    served.apply(served.plan({f"p-{i}" for i in range(9)}))
    firsts = [run.processor._order()[0] for _ in range(400)]
    assert firsts.count("x") >= 120  # expected 200; 40 without the weights


def test_a_queue_order_needs_a_queue() -> None:
    from asyncq._worker.processor import QueueOrder

    with pytest.raises(ValueError, match=r"^at least one queue is needed$"):
        QueueOrder({})


def test_the_weights_replace_the_priorities_in_the_draw() -> None:
    import random

    from asyncq._worker.processor import QueueOrder

    order = QueueOrder({"a": 1, "b": 1}, rng=random.Random(7), weights={"a": 1e6, "b": 1e-6})
    assert all(order()[0] == "a" for _ in range(50))


async def test_the_room_and_bytes_each_fetch_carries_follow_tasks_starting_and_ending() -> None:
    fake = FakeBroker()
    gates: dict[str, asyncio.Event] = {}
    started: list[str] = []

    async def handler(task: Task) -> None:
        started.append(task.id or "")
        await gates.setdefault(task.id or "", asyncio.Event()).wait()

    limits = Limits(max_inflight_bytes=1000, local_queue_concurrency={Q: 2})
    async with Running(fake, handler, concurrency=3, limits=limits) as run:

        async def fetch_after(step: Any) -> dict[str, Any]:
            count = len(fake.fetches)
            step()
            run.processor._wakeup.set()
            await wait_until(lambda: len(fake.fetches) > count, what="the next fetch")
            return fake.fetches[-1]

        a = fake.enqueue(message(payload=b"a" * 100))
        await fetch_after(lambda: None)
        await wait_until(lambda: len(started) == 1, what="a started")
        b = fake.enqueue(message(payload=b"b" * 10))
        await fetch_after(lambda: None)
        await wait_until(lambda: len(started) == 2, what="b started")
        both = await fetch_after(lambda: None)
        assert (both["max_bytes"], both["limits"]) == (890, {Q: (-1, 0)})
        gates.setdefault(a.id, asyncio.Event())
        after_a = await fetch_after(gates[a.id].set)
        assert (after_a["max_bytes"], after_a["limits"]) == (990, {Q: (-1, 1)})
        gates.setdefault(b.id, asyncio.Event()).set()


class _Progress:
    def __init__(self) -> None:
        self.ends: list[bool] = []

    def begin(self, task: Task, spawn: object) -> None:
        return None

    def end(self, task: Task, ok: bool) -> None:
        self.ends.append(ok)


@pytest.mark.parametrize(("handler", "ok"), [(_returns, True), (_fails, False)])
async def test_progress_ends_as_the_handler_did(handler: Any, ok: bool) -> None:
    fake = FakeBroker()
    fake.enqueue(message())
    run = Running(fake, handler)
    progress = run.processor.attempts._progress = _Progress()  # type: ignore[assignment]
    async with run:
        await wait_until(lambda: progress.ends, what="ended")
    assert progress.ends == [ok]


async def test_progress_of_a_handler_stopped_after_it_returned_is_not_ok() -> None:
    # A cancel that lands as the handler returns: the run counts as stopped.
    fake = FakeBroker()
    msg = fake.enqueue(message())
    run = Running(fake, _returns)
    progress = run.processor.attempts._progress = _Progress()  # type: ignore[assignment]

    async def handler(task: Task) -> None:
        run.active.cancel(msg.id, TaskCanceledError())
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)

    run.processor.handler = handler
    async with run:
        await wait_until(lambda: progress.ends, what="ended")
    assert progress.ends == [False]


async def test_a_task_due_exactly_now_is_not_run() -> None:
    fake = FakeBroker()
    msg = fake.enqueue(message(timeout=0, deadline=int(fake.now)))
    ran: list[str] = []

    async def handler(task: Task) -> None:
        ran.append(task.id or "")

    async with Running(fake, handler):
        await wait_until(lambda: fake.state(msg.id) == "retry", what="retried unrun")
    assert ran == []


async def test_the_handler_sees_its_deadline_and_writes_its_result() -> None:
    fake = FakeBroker(now=time.time())  # the result writer checks the deadline on the real clock
    msg = fake.enqueue(message(retention=60, timeout=30))
    seen: list[datetime | None] = []

    async def handler(task: Task) -> None:
        seen.append(task.deadline)
        assert task.result_writer is not None
        await task.result_writer.write(b"out")

    async with Running(fake, handler):
        await wait_until(lambda: fake.state(msg.id) == "completed", what="completed")
    assert seen == [datetime.fromtimestamp(fake.now + 30, UTC)]
    assert fake.tasks[msg.id].result == b"out"


async def test_a_result_written_after_the_handler_returned_is_refused() -> None:
    # While its outcome is written, and after: the task is no longer the handler's.
    from asyncq._worker.result_writer import ResultWriteError

    fake = FakeBroker()
    msg = fake.enqueue(message(retention=60))
    tasks: list[Task] = []

    async def handler(task: Task) -> None:
        tasks.append(task)

    held = fake.hold("ack_many")
    async with Running(fake, handler) as run:
        await asyncio.wait_for(held.arrived.wait(), 5)
        writer = tasks[0].result_writer
        assert writer is not None
        with pytest.raises(ResultWriteError, match="the task's handler has returned"):
            await writer.write(b"late")
        held.release.set()
        await wait_until(lambda: not run.active, what="finished")
        with pytest.raises(ResultWriteError, match="the task's handler has returned"):
            await writer.write(b"later")
    assert fake.tasks[msg.id].result is None


class _Pool:
    def __init__(self, size: Any) -> None:
        self.max_connections = size


class _Client:
    def __init__(self, pool: Any) -> None:
        self.connection_pool = pool


@pytest.mark.parametrize(
    ("redis", "limit"),
    [
        (_Client(_Pool(1)), 1),
        (_Client(_Pool(3)), 1),
        (_Client(_Pool(6)), 3),
        (_Client(_Pool(10_000)), 64),
        (_Client(_Pool(0)), 64),
        (_Client(_Pool(None)), 64),
        (_Client(object()), 64),
        (object(), 64),
    ],
)
def test_the_write_limit_is_half_the_connection_pool(redis: object, limit: int) -> None:
    from asyncq._worker import processor

    assert processor._MAX_WRITES == 64
    assert processor.write_limit(redis) == limit
    assert type(processor.write_limit(redis)) is int


async def test_a_run_that_waited_for_its_types_token_begins_after_the_wait() -> None:
    fake = FakeBroker()
    fake.enqueue(message("api"))
    held = fake.hold("take_type_tokens")
    run = Running(fake, _returns, limits=Limits(type_rate_limits={"api": "10/s"}))
    history = run.processor.attempts.writer.history = _History()  # type: ignore[assignment]
    async with run:
        await asyncio.wait_for(held.arrived.wait(), 5)
        fetched_at = fake.now
        fake.advance(5)  # the token call took 5 s
        held.release.set()
        await wait_until(lambda: history.runs, what="counted")
    ((_, _, began, ended, *_),) = history.runs
    assert began == ended == fetched_at + 5


async def test_a_finished_task_leaves_no_reference_cycle_behind() -> None:
    # Freed by reference counting when it ends, not by the cyclic collector later: the
    # collector's passes over every task's objects cost a quarter of the worker's CPU.
    fake = FakeBroker()
    for _ in range(20):
        fake.enqueue(message())
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        async with Running(fake, _returns, concurrency=5):
            await wait_until(lambda: not fake.tasks, what="all done")
        gc.collect()
        left = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not left & {"ActiveTask", "Lease", "TaskMessage", "TaskResultWriter"}, left
