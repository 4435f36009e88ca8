"""Durable runs as the Inspector shows them: a run's record (``asyncq._keys.run_key``)
and its task read into :class:`~asyncq._inspection.records.DurableRunInfo`. Pure
functions: the Inspector reads Redis, these decide what it means."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncq._broker.durable import FAR_FUTURE
from asyncq._broker.inspect import StoredTask
from asyncq._inspection.records import (
    DurableEntry,
    DurableRunInfo,
    DurableRunSummary,
    DurableWait,
)
from asyncq._time import iso, utc_from_timestamp
from asyncq.task import TaskState

__all__ = [
    "open_signal_wait",
    "run_info",
    "run_json",
    "run_state",
    "run_summary",
    "signal_splits",
    "summary_json",
    "wait_json",
]

_ENDED = {"succeeded": "completed", "failed": "failed"}


def run_state(recorded: str | None, task: TaskState | None) -> str:
    """The run's state from its record's ``state`` and its task's state: ``pending``,
    ``running``, ``waiting``, ``completed``, ``failed`` or ``cancelled``.

    The record says how the function ended; a task archived with no end recorded was
    stopped or archived by hand (failed); a run marked cancelled whose attempt still
    runs is running until the attempt stops. A record still ``pending`` (as the run's
    start wrote it) means no attempt has written to it: the run is pending until an
    attempt is active.
    """
    if recorded in _ENDED:
        return _ENDED[recorded]
    if recorded == "cancelled":
        return "running" if task is TaskState.ACTIVE else "cancelled"
    if task is TaskState.ARCHIVED:
        return "failed"
    if task is TaskState.COMPLETED:
        return "completed"
    if recorded == "pending":
        return "running" if task is TaskState.ACTIVE else "pending"
    # a waiting run the forwarder, a step or a signal made pending is running again
    parked = task is TaskState.SCHEDULED or task is None
    return "waiting" if recorded == "waiting" and parked else "running"


def signal_splits(signature: str) -> list[tuple[str, str]]:
    """The (name, key) pairs a wait's signature ``wait <name> <key>`` can stand for: a
    name or key may hold spaces, so every space after ``wait `` is a candidate split."""
    rest = signature[len("wait ") :]
    return [(rest[:i], rest[i + 1 :]) for i, c in enumerate(rest) if c == " "]


def open_signal_wait(record: Mapping[str, bytes]) -> tuple[int, str] | None:
    """The index and signature of the signal wait a waiting run sits in (the last
    entry, a wait with nothing recorded); None when it waits for something else."""
    if record.get("state") != b"waiting" or "wait" in record:
        return None
    last = _count(record) - 1
    signature = _text(record.get(f"s:{last}"))
    if last < 0 or not signature.startswith("wait ") or _recorded(record, last):
        return None
    return last, signature


def _text(raw: bytes | None) -> str:
    return "" if raw is None else raw.decode("utf-8", "replace")


def _count(record: Mapping[str, bytes]) -> int:
    """Entries: the record's signatures are numbered from 0 without gaps."""
    n = 0
    while f"s:{n}" in record:
        n += 1
    return n


def _recorded(record: Mapping[str, bytes], index: int) -> bool:
    return f"r:{index}" in record or f"e:{index}" in record


def _time(raw: bytes | None) -> float | None:
    try:
        return None if raw is None else float(raw)
    except ValueError:
        return None


def _wait(record: Mapping[str, bytes], signal: tuple[str, str] | None) -> DurableWait | None:
    if record.get("state") != b"waiting":
        return None
    score = _time(record.get("until"))
    until = None if score is None or score >= FAR_FUTURE else utc_from_timestamp(score)
    steps = _text(record.get("wait"))
    if steps:
        indices = tuple(int(i) for i in steps.split(",") if i.isdigit())
        return DurableWait("steps", steps=indices, until=until)
    if open_signal_wait(record) is not None:
        name, key = signal if signal is not None else (None, None)
        return DurableWait("signal", signal_name=name, signal_key=key, until=until)
    return DurableWait("sleep", until=until)


def run_info(
    queue: str,
    run_id: str,
    record: Mapping[str, bytes],
    task: StoredTask | None,
    signal: tuple[str, str] | None = None,
) -> DurableRunInfo:
    """The run *run_id* of *queue* from its *record* and its *task* (None: gone);
    *signal*: the name and key of the signal it waits for, when it waits for one."""
    task_state = task.state if task is not None else None
    state = run_state(_text(record.get("state")) or None, task_state)
    waiting = _wait(record, signal) if state == "waiting" else None
    waited = set(waiting.steps) if waiting is not None else set()
    open_wait = open_signal_wait(record) if waiting is not None else None
    entries: list[DurableEntry] = []
    count = _count(record)
    slept = waiting is not None and waiting.kind == "sleep"
    for index in range(count):
        signature = _text(record.get(f"s:{index}"))
        kind = signature.split(" ", 1)[0]
        deadline = _time(record.get(f"d:{index}"))
        error = record.get(f"e:{index}")
        entries.append(
            DurableEntry(
                index=index,
                kind=kind,
                signature=signature,
                step_id=f"{run_id}-{index}" if kind == "step" else None,
                result=record.get(f"r:{index}"),
                error=None if error is None else _text(error),
                deadline=None if deadline is None else utc_from_timestamp(deadline),
                waited_for=index in waited
                or (open_wait is not None and open_wait[0] == index)
                or (slept and index == count - 1),
            )
        )
    msg = task.message if task is not None and task.decodable else None
    updated = None
    if msg is not None:
        stamp = max(msg.completed_at, msg.last_failed_at)
        updated = utc_from_timestamp(stamp) if stamp > 0 else None
    return DurableRunInfo(
        id=run_id,
        queue=queue,
        type=msg.type if msg is not None else None,
        state=state,
        task_state=None if task is None else str(task.state),
        entries=entries,
        waiting_for=waiting,
        next_process_at=None if task is None else task.next_process_at,
        updated=updated,
        last_error=(msg.error_msg or None) if msg is not None else None,
    )


def run_summary(info: DurableRunInfo) -> DurableRunSummary:
    return DurableRunSummary(
        id=info.id,
        queue=info.queue,
        type=info.type,
        state=info.state,
        waiting_for=info.waiting_for,
        entries=len(info.entries),
        steps_done=info.steps_done,
        steps_total=info.steps_total,
        updated=info.updated,
    )


def wait_json(wait: DurableWait | None) -> dict[str, Any] | None:
    """What a run waits for as JSON (the CLI's ``--json`` and the web API)."""
    if wait is None:
        return None
    return {
        "kind": wait.kind,
        "steps": list(wait.steps),
        "signal_name": wait.signal_name,
        "signal_key": wait.signal_key,
        "until": iso(wait.until),
    }


def run_json(info: DurableRunInfo) -> dict[str, Any]:
    """A run as JSON; results are the recorded JSON text (``""`` for a timed-out wait)."""
    return {
        "id": info.id,
        "queue": info.queue,
        "type": info.type,
        "state": info.state,
        "task_state": info.task_state,
        "waiting_for": wait_json(info.waiting_for),
        "steps_done": info.steps_done,
        "steps_total": info.steps_total,
        "next_process_at": iso(info.next_process_at),
        "updated": iso(info.updated),
        "last_error": info.last_error,
        "entries": [
            {
                "index": e.index,
                "kind": e.kind,
                "signature": e.signature,
                "step_id": e.step_id,
                "result": None if e.result is None else e.result.decode("utf-8", "replace"),
                "error": e.error,
                "deadline": iso(e.deadline),
                "waited_for": e.waited_for,
            }
            for e in info.entries
        ],
    }


def summary_json(row: DurableRunSummary) -> dict[str, Any]:
    """A row of the list of runs as JSON."""
    return {
        "id": row.id,
        "queue": row.queue,
        "type": row.type,
        "state": row.state,
        "waiting_for": wait_json(row.waiting_for),
        "entries": row.entries,
        "steps_done": row.steps_done,
        "steps_total": row.steps_total,
        "updated": iso(row.updated),
    }
