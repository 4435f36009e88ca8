"""Turn Inspector records into JSON-ready dicts and readable payload text."""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from asyncq import (
    DailyStats,
    GroupInfo,
    QueueInfo,
    SchedulerEnqueueEvent,
    SchedulerEntry,
    ServerInfo,
    TaskInfo,
    TypeRateInfo,
    WorkerInfo,
)
from asyncq._duration import format_short
from asyncq._http import json_depth
from asyncq._time import iso

__all__ = [
    "Body",
    "body",
    "daily_dict",
    "event_dict",
    "group_dict",
    "queue_dict",
    "relative",
    "scheduler_dict",
    "server_dict",
    "stamp",
    "task_dict",
    "task_timeline",
    "type_rate_dict",
    "worker_dict",
]

_PRINTABLE = set(string.printable) - set("\x0b\x0c")
MAX_JSON_DEPTH = 64
"""Deepest JSON shown pretty-printed; deeper payloads are shown as the text they are
(indenting hundreds of levels helps nobody, and Python's parser gives up near 1,000)."""


@dataclass(frozen=True, slots=True)
class Body:
    """A payload or result made readable: ``kind`` is json, text, hex or empty."""

    kind: str
    text: str
    size: int

    def short(self, limit: int) -> str:
        """One line of at most *limit* characters."""
        flat = " ".join(self.text.split()) if self.kind != "hex" else self.text
        return flat if len(flat) <= limit else flat[: limit - 1] + "…"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "size": self.size}


def body(data: bytes | None, *, hex_limit: int = 4096) -> Body:
    """Pretty JSON when *data* is JSON, text when it is printable UTF-8, else a hex dump."""
    if not data:
        return Body("empty", "", 0)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            pass
        else:
            if json_depth(value) <= MAX_JSON_DEPTH:
                return Body("json", json.dumps(value, indent=2, ensure_ascii=False), len(data))
        if all(ch in _PRINTABLE or ch.isprintable() for ch in text):
            return Body("text", text, len(data))
    shown = data[:hex_limit]
    lines = []
    for off in range(0, len(shown), 16):
        chunk = shown[off : off + 16]
        ascii_part = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}  {chunk.hex(' '):<47}  {ascii_part}")
    if len(data) > hex_limit:
        lines.append(f"… {len(data) - hex_limit} more bytes")
    return Body("hex", "\n".join(lines), len(data))


def stamp(value: datetime | None) -> str:
    """``2026-11-28 12:00:05 UTC``: how a page shows a moment, to the second (the times
    Redis keeps are whole seconds; a page mixing those with microseconds reads badly)."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(value: datetime | None, now: datetime) -> str:
    """``in 3m4s`` / ``5s ago`` / ``-``."""
    if value is None:
        return "-"
    delta = value - now
    if delta >= timedelta(0):
        return f"in {format_short(delta)}"
    return f"{format_short(-delta)} ago"


def queue_dict(info: QueueInfo) -> dict[str, Any]:
    error_rate = info.failed / info.processed if info.processed else 0.0
    return {
        "queue": info.queue,
        "paused": info.paused,
        "size": info.size,
        "groups": info.groups,
        "memory_usage": info.memory_usage,
        "latency_seconds": info.latency.total_seconds(),
        "active": info.active,
        "pending": info.pending,
        "aggregating": info.aggregating,
        "scheduled": info.scheduled,
        "retry": info.retry,
        "archived": info.archived,
        "completed": info.completed,
        "processed": info.processed,
        "failed": info.failed,
        "error_rate": error_rate,
        "processed_total": info.processed_total,
        "failed_total": info.failed_total,
        "timestamp": iso(info.timestamp),
        "concurrency_limit": info.concurrency_limit,
        "running": info.running,
        "held_back": info.held_back,
        "rate_limit": info.rate_limit,
        "rate_tokens": info.rate_tokens,
        "ordered": info.ordered,
        "configured_by": info.configured_by,
    }


def daily_dict(stats: DailyStats) -> dict[str, Any]:
    return {
        "queue": stats.queue,
        "date": stats.date.isoformat(),
        "processed": stats.processed,
        "failed": stats.failed,
    }


def group_dict(group: GroupInfo) -> dict[str, Any]:
    return {"group": group.group, "size": group.size}


def task_dict(task: TaskInfo, *, limit: int | None = None) -> dict[str, Any]:
    """A task as JSON; payload/result rendered (and shortened to *limit* characters if set)."""
    payload = body(task.payload)
    result = body(task.result) if task.result is not None else None
    out: dict[str, Any] = {
        "id": task.id,
        "queue": task.queue,
        "type": task.type,
        "state": task.state.value,
        "max_retry": task.max_retry,
        "retried": task.retried,
        "last_error": task.last_error,
        "last_failed_at": iso(task.last_failed_at),
        "timeout_seconds": None if task.timeout is None else task.timeout.total_seconds(),
        "deadline": iso(task.deadline),
        "group": task.group,
        "next_process_at": iso(task.next_process_at),
        "retention_seconds": None if task.retention is None else task.retention.total_seconds(),
        "completed_at": iso(task.completed_at),
        "headers": dict(task.headers),
        "is_orphaned": task.is_orphaned,
        "payload": payload.as_dict(),
        "result": result.as_dict() if result is not None else None,
    }
    if limit is not None:
        out["payload"]["text"] = payload.short(limit)
        if result is not None:
            out["result"]["text"] = result.short(limit)
    return out


def task_timeline(
    task: TaskInfo, now: datetime, *, started: datetime | None = None
) -> list[tuple[datetime, str]]:
    """The moments the stored task records, oldest first (Redis keeps no full history);
    *started*: when the running attempt started (the worker running it says)."""
    events: list[tuple[datetime, str]] = []
    if started is not None and task.state.value == "active":
        events.append((started, f"started (attempt {task.retried + 1} of {task.max_retry + 1})"))
    if task.last_failed_at is not None:
        # A failure that leads to a retry counts in `retried`; the one that archives the
        # task does not (asynq), so an archived task's last failure is attempt retried + 1.
        attempt = task.retried + 1 if task.state.value == "archived" else task.retried
        attempts = task.max_retry + 1
        events.append((task.last_failed_at, f"failed (attempt {attempt} of {attempts})"))
    if task.completed_at is not None:
        events.append((task.completed_at, "completed"))
        if task.retention is not None:
            events.append((task.completed_at + task.retention, "result expires"))
    if task.next_process_at is not None and task.state.value in ("scheduled", "retry", "pending"):
        label = {"scheduled": "scheduled to run", "retry": "next retry", "pending": "ready since"}
        events.append((task.next_process_at, label[task.state.value]))
    if task.deadline is not None:
        events.append((task.deadline, "deadline"))
    events.append((now, f"now: {task.state.value}"))
    events.sort(key=lambda e: e[0])
    return events


def worker_dict(w: WorkerInfo, *, limit: int = 200) -> dict[str, Any]:
    return {
        "task_id": w.task_id,
        "task_type": w.task_type,
        "payload": body(w.task_payload).short(limit),
        "queue": w.queue,
        "started": iso(w.started),
        "deadline": iso(w.deadline),
    }


def server_dict(s: ServerInfo) -> dict[str, Any]:
    return {
        "id": s.id,
        "host": s.host,
        "pid": s.pid,
        "concurrency": s.concurrency,
        "queues": dict(s.queues),
        "strict_priority": s.strict_priority,
        "started": iso(s.started),
        "status": s.status,
        "active_workers": [worker_dict(w) for w in s.active_workers],
        "type_rate_limits": dict(s.type_rate_limits),
        "queue_concurrency": dict(s.queue_concurrency),
        "local_queue_concurrency": dict(s.local_queue_concurrency),
        "rate_limits": dict(s.rate_limits),
        "ordered_queues": list(s.ordered_queues),
    }


def type_rate_dict(t: TypeRateInfo) -> dict[str, Any]:
    return {
        "task_type": t.task_type,
        "rate": t.rate,
        "per_second": t.per_second,
        "tokens": t.tokens,
        "next_token_seconds": None if t.next_token is None else t.next_token.total_seconds(),
        "limited": t.limited,
        "servers": dict(t.servers),
    }


def scheduler_dict(e: SchedulerEntry, *, limit: int = 200) -> dict[str, Any]:
    return {
        "id": e.id,
        "spec": e.spec,
        "task_type": e.task_type,
        "payload": body(e.task_payload).short(limit),
        "options": list(e.options),
        "next": iso(e.next),
        "prev": iso(e.prev),
    }


def event_dict(e: SchedulerEnqueueEvent) -> dict[str, Any]:
    return {"task_id": e.task_id, "enqueued_at": iso(e.enqueued_at)}
