"""Per-queue broker transitions that only the tests use, with their Lua scripts (lua/ here).

The worker calls the multi-queue variants (``Broker.fetch``, ``forward_queues``,
``scan_leases``, ``delete_expired_completed_queues``,
``reclaim_stale_aggregation_sets_queues``): one script call for many queues. These
per-queue ones are asynq's scripts, kept for the tests as a reference the multi-queue
scripts are checked against (the model state machine runs both), and as a short way to
put a task in a state (``dequeue`` makes it active).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from importlib import resources
from pathlib import Path

import structlog

from asyncq._broker import Broker, DequeuedTask
from asyncq._broker._base import LUA_PACKAGE, as_text
from asyncq._logging import RateLimiter, error_text
from asyncq._redis.errors import REDIS_ERRORS
from asyncq._redis.scripts import Script, expand_includes, load_script
from asyncq._time import to_unix
from asyncq.proto.asynq import TaskMessage

__all__ = [
    "SCRIPTS",
    "delete_expired_completed_tasks",
    "dequeue",
    "dequeue_many",
    "done_many",
    "forward_if_ready",
    "list_lease_expired",
    "mark_as_complete_many",
    "reclaim_stale_aggregation_sets",
    "script",
]

LUA = Path(__file__).resolve().parent / "lua"
_ALLOW_OOM = frozenset({"dequeue_many", "delete_expired_completed"})  # as the package had them


def _load(name: str) -> Script:
    source = (LUA / f"{name}.lua").read_text("utf-8")
    lib = resources.files(LUA_PACKAGE).joinpath("lua", "_lib")
    source = expand_includes(source, f"tests/support/lua/{name}.lua", lib)
    return Script(name, source, allow_oom=name in _ALLOW_OOM)


SCRIPTS: dict[str, Script] = {p.stem: _load(p.stem) for p in sorted(LUA.glob("*.lua"))}
"""The test-only scripts by name."""

_log = structlog.get_logger("asyncq")
_dequeue_errors = RateLimiter(3.0)


def script(name: str) -> Script:
    """A script by name: a test-only one of tests/support/lua, else the package's."""
    return SCRIPTS[name] if name in SCRIPTS else load_script(LUA_PACKAGE, name)


async def dequeue(broker: Broker, qnames: Sequence[str]) -> DequeuedTask | None:
    """Take one task from the first non-paused, non-empty queue in *qnames* order."""
    got = await dequeue_many(broker, qnames, 1)
    return got[0] if got else None


async def dequeue_many(broker: Broker, qnames: Sequence[str], count: int) -> list[DequeuedTask]:
    """Take up to *count* tasks, trying the queues in *qnames* order, each with its own lease.

    One script call per queue tried. A message that cannot be decoded, or
    that names another queue, is archived (and logged) instead of returned,
    and its slot is refilled. When a call fails after tasks were taken from
    earlier queues, those tasks are returned (and the failure logged)
    rather than left to lease recovery; with nothing taken it is raised.
    """
    if count < 1:
        raise ValueError(f"dequeue count must be at least 1, got {count}")
    out: list[DequeuedTask] = []
    for qname in qnames:
        qk = broker._q(qname)
        keys_ = (qk.pending, qk.paused, qk.active, qk.lease)
        while True:
            want = count - len(out)
            now = broker.clock()
            expiry = now + broker.lease_duration
            try:
                res = await broker._run(
                    SCRIPTS["dequeue_many"],
                    keys_,
                    (int(expiry), qk.task_prefix, want),
                    qname,
                    "",
                )
            except REDIS_ERRORS as exc:  # must not cost the tasks already in hand
                if not out:
                    raise
                if _dequeue_errors.allow():
                    _log.warning(
                        "dequeue failed after tasks were taken; returning those",
                        queue=qname,
                        taken=len(out),
                        error=error_text(exc),
                        suppressed_since_last=_dequeue_errors.take_suppressed(),
                    )
                return out
            for i in range(0, len(res), 2):
                tid = as_text(res[i])
                data = res[i + 1]
                if data is None:
                    _log.error("dropped pending id without task hash", task_id=tid, queue=qname)
                    continue
                msg = await broker._decode_or_archive(
                    qk, tid, data, now, qk.active, check_queue=True
                )
                if msg is not None:
                    out.append(DequeuedTask(msg, expiry))
            if len(out) >= count or len(res) < 2 * want:
                break
        if len(out) >= count:
            break
    return out


async def done_many(broker: Broker, msgs: Sequence[TaskMessage]) -> list[Exception | None]:
    """asynq's Done for many tasks at once: one ``ack_many`` call, a result per message."""
    return await broker.ack_many([(msg, False) for msg in msgs])


async def mark_as_complete_many(
    broker: Broker, msgs: Sequence[TaskMessage]
) -> list[Exception | None]:
    """asynq's MarkAsComplete for many tasks at once (see :func:`done_many`)."""
    return await broker.ack_many([(msg, True) for msg in msgs])


async def forward_if_ready(broker: Broker, qnames: Sequence[str]) -> int:
    """Move due scheduled/retry tasks to pending (or back to their group); returns count."""
    total = 0
    for qname in qnames:
        qk = broker._q(qname)
        for source in (qk.scheduled, qk.retry):
            while True:
                now = broker.clock()
                n: int = await broker._run(
                    SCRIPTS["forward"],
                    (source, qk.pending, qk.groups),
                    (
                        int(now),
                        qk.task_prefix,
                        int(now * 1_000_000_000),
                        qk.group_prefix,
                        qk.wakeup,
                        qname,
                    ),
                    qname,
                    "",
                )
                total += n
                if n == 0:
                    break
    return total


async def list_lease_expired(
    broker: Broker, cutoff: datetime, qnames: Sequence[str]
) -> list[TaskMessage]:
    """Messages of active tasks whose lease expired at or before *cutoff*.

    A message that cannot be decoded is archived (and logged) instead.
    """
    cut = to_unix(cutoff)
    out: list[TaskMessage] = []
    for qname in qnames:
        qk = broker._q(qname)
        res = await broker._run(
            SCRIPTS["list_lease_expired"], (qk.lease,), (cut, qk.task_prefix), qname, ""
        )
        for i in range(0, len(res), 2):
            msg = await broker._decode_or_archive(
                qk, as_text(res[i]), res[i + 1], broker.clock(), qk.active
            )
            if msg is not None:
                out.append(msg)
    return out


async def delete_expired_completed_tasks(broker: Broker, qname: str, batch_size: int = 100) -> int:
    """Delete completed tasks whose retention expired, *batch_size* per script call.

    Loops until none are left; returns how many were deleted.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    qk = broker._q(qname)
    total = 0
    while True:
        n: int = await broker._run(
            SCRIPTS["delete_expired_completed"],
            (qk.completed,),
            (int(broker.clock()), qk.task_prefix, batch_size),
            qname,
            "",
        )
        total += n
        if n == 0:
            return total


async def reclaim_stale_aggregation_sets(broker: Broker, qname: str) -> None:
    """Move members of sets past their deadline back into their group."""
    qk = broker._q(qname)
    await broker._run(
        SCRIPTS["reclaim_stale_aggregation_sets"],
        (qk.aggregation_sets, qk.groups),
        (int(broker.clock()), qk.group_prefix),
        qname,
        "",
    )
