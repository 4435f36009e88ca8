"""Text helpers of the CLI: parsing flag values, and tables, charts and JSON for output."""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from asyncq._duration import format_short
from asyncq.task import TaskInfo, TaskState

__all__ = [
    "bar_chart",
    "format_bytes",
    "format_payload",
    "format_time",
    "next_page_hint",
    "parse_time",
    "relative",
    "table",
    "task_rows",
    "task_text",
    "terminal_width",
    "to_json",
]


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 time with a UTC offset (``2024-05-01T12:00:00Z``, ``...+02:00``)."""
    s = text.strip()
    try:
        when = datetime.fromisoformat(s[:-1] + "+00:00" if s[-1:] in "zZ" and s else s)
    except ValueError:
        raise ValueError(
            f"invalid time {text!r}: expected RFC 3339, e.g. 2024-05-01T12:00:00Z"
        ) from None
    if when.tzinfo is None:
        raise ValueError(f"invalid time {text!r}: a UTC offset is required (e.g. Z or +02:00)")
    return when


def format_time(when: datetime | None) -> str:
    """``2024-05-01 12:00:00 UTC`` style, or ``-`` for none."""
    if when is None:
        return "-"
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(when: datetime | None, now: datetime) -> str:
    """``in 5m`` / ``3h ago`` / ``now``, or ``-`` for none."""
    if when is None:
        return "-"
    delta = when - now
    if abs(delta.total_seconds()) < 1:
        return "now"
    if delta > timedelta(0):
        return f"in {format_short(delta)}"
    return f"{format_short(-delta)} ago"


def format_bytes(n: int) -> str:
    """Human-readable byte count (``512 B``, ``12.3 KB``, ``4.0 MB``)."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def printable_text(data: bytes | None) -> str | None:
    """The bytes as text when they are printable UTF-8, else None."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if all(ch.isprintable() or ch in "\n\r\t" for ch in text):
        return text
    return None


def format_payload(data: bytes | None, *, one_line: bool = True) -> str:
    """Payload as text when printable UTF-8, else ``non-printable bytes (N)``."""
    if data is None:
        return "-"
    text = printable_text(data)
    if text is None:
        return f"non-printable bytes ({len(data)})"
    if one_line:
        text = " ".join(text.split())
    return text


def terminal_width() -> int:
    """Columns of the terminal (80 when not a terminal)."""
    return max(40, shutil.get_terminal_size((80, 24)).columns)


def output_width() -> int | None:
    """Columns to fit tables into: the terminal's, or None (full values) for a pipe or file.

    ``$COLUMNS`` forces a width even when stdout is not a terminal.
    """
    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return terminal_width()
    return None


def _clip(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + "…" if width > 0 else ""


def next_page_hint(command: str, queue: str | None, limit: int, cursor: str) -> str:
    """The command line that lists the next page of a SCAN-paged listing."""
    more = [command]
    if queue is not None:
        more.append(f"-q {shlex.quote(queue)}")
    more += [f"-n {limit}", f"--cursor {shlex.quote(cursor)}"]
    return f"More: {' '.join(more)}"


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    width: int | None = None,
    keep: Sequence[int] = (),
) -> str:
    """Columns separated by two spaces under dashed headers, fitted into *width*.

    Columns listed in *keep* (e.g. task IDs) are never shortened; the others
    shrink, widest first, with an ellipsis, but never below their header.
    Without *width*, tables fit the terminal; written to a pipe or a file
    (and ``$COLUMNS`` unset) every value is printed in full.
    """
    limit = output_width() if width is None else width
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    gap = 2
    floor = [max(len(h), 4) for h in headers]
    while limit is not None and sum(widths) + gap * (len(widths) - 1) > limit:
        candidates = [i for i in range(len(widths)) if i not in keep and widths[i] > floor[i]]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: widths[i])
        widths[widest] -= 1
    lines = []
    for row in [list(headers), ["-" * w for w in widths], *cells]:
        parts = [_clip(c, w).ljust(w) for c, w in zip(row, widths, strict=True)]
        lines.append((" " * gap).join(parts).rstrip())
    return "\n".join(lines)


def _bar_char() -> str:
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
    return "█" if "utf" in encoding else "#"


def bar_chart(items: Sequence[tuple[str, int]], *, width: int | None = None) -> str:
    """One horizontal bar per (label, count), scaled to the largest count."""
    width = min(terminal_width() if width is None else width, 100)
    if not items:
        return "(none)"
    label_w = min(max(len(label) for label, _ in items), 24)
    count_w = max(len(str(n)) for _, n in items)
    bar_w = max(width - label_w - count_w - 3, 10)
    top = max(n for _, n in items)
    char = _bar_char()
    lines = []
    for label, n in items:
        length = 0 if top == 0 else round(n / top * bar_w)
        if n > 0:
            length = max(length, 1)
        bar = (char * length).ljust(bar_w)
        lines.append(f"{_clip(label, label_w).ljust(label_w)} {bar} {str(n).rjust(count_w)}")
    return "\n".join(lines)


def progress_cell(t: TaskInfo) -> str:
    """``40% rows 400/1000`` (``-`` when the task reported none)."""
    if t.progress is None:
        return "-"
    return f"{t.progress.percent}% {' '.join(t.progress.message.split())}".rstrip()


def task_rows(
    state: TaskState, tasks: Sequence[TaskInfo], now: datetime
) -> tuple[list[str], list[list[str]]]:
    """Table headers and rows for tasks in *state* (the ID column comes first)."""

    def base(t: TaskInfo) -> list[str]:
        return [t.id, t.type, format_payload(t.payload)]

    if state is TaskState.ACTIVE:
        return ["ID", "Type", "Payload", "Orphaned", "Progress"], [
            [*base(t), "yes" if t.is_orphaned else "no", progress_cell(t)] for t in tasks
        ]
    if state is TaskState.SCHEDULED:
        return ["ID", "Type", "Payload", "Process In"], [
            [*base(t), relative(t.next_process_at, now)] for t in tasks
        ]
    if state is TaskState.RETRY:
        return ["ID", "Type", "Payload", "Retry In", "Retried", "Error"], [
            [*base(t), relative(t.next_process_at, now), f"{t.retried}/{t.max_retry}",
             " ".join(t.last_error.split())]
            for t in tasks
        ]  # fmt: skip
    if state is TaskState.ARCHIVED:
        return ["ID", "Type", "Payload", "Failed", "Error"], [
            [*base(t), relative(t.last_failed_at, now), " ".join(t.last_error.split())]
            for t in tasks
        ]
    if state is TaskState.COMPLETED:
        return ["ID", "Type", "Payload", "Completed", "Result"], [
            [*base(t), relative(t.completed_at, now), format_payload(t.result)] for t in tasks
        ]
    if state is TaskState.AGGREGATING:
        return ["ID", "Type", "Payload", "Group"], [[*base(t), t.group] for t in tasks]
    return ["ID", "Type", "Payload"], [base(t) for t in tasks]


def task_text(t: TaskInfo) -> str:
    """Every detail of one task, one 'Key: value' line each."""
    now = datetime.now(UTC)
    lines: list[tuple[str, str]] = [
        ("Queue", t.queue),
        ("ID", t.id),
        ("Type", t.type),
        ("State", t.state.value + (" (orphaned)" if t.is_orphaned else "")),
        ("Retried", f"{t.retried}/{t.max_retry}"),
        ("Timeout", format_short(t.timeout) if t.timeout else "-"),
        ("Deadline", format_time(t.deadline)),
    ]
    if t.progress is not None:
        p = t.progress
        bar = "#" * round(p.fraction * 20)
        text = f"[{bar.ljust(20, '.')}] {p.percent}% {p.message}".rstrip()
        lines.append(("Progress", f"{text} ({relative(p.updated_at, now)})"))
    if t.group:
        lines.append(("Group", t.group))
    if t.next_process_at is not None:
        when = f"{format_time(t.next_process_at)} ({relative(t.next_process_at, now)})"
        lines.append(("Next process", when))
    if t.last_error or t.last_failed_at:
        lines.append(("Last failure", format_time(t.last_failed_at)))
        lines.append(("Last error", t.last_error or "-"))
    if t.completed_at is not None:
        lines.append(("Completed", format_time(t.completed_at)))
    if t.retention is not None:
        lines.append(("Retention", format_short(t.retention)))
    if t.headers:
        lines.append(("Headers", ", ".join(f"{k}={v}" for k, v in sorted(t.headers.items()))))
    lines.append(("Payload", format_payload(t.payload, one_line=False)))
    if t.result is not None:
        lines.append(("Result", format_payload(t.result, one_line=False)))
    width = max(len(k) for k, _ in lines) + 2
    return "\n".join(f"{(k + ':').ljust(width)}{v}" for k, v in lines)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if isinstance(v, bytes | bytearray):
                # Text when printable UTF-8 (else null), and always the exact bytes.
                out[f.name] = printable_text(bytes(v))
                out[f"{f.name}_base64"] = base64.b64encode(v).decode()
            elif v is None and "bytes" in str(f.type):
                out[f.name] = out[f"{f.name}_base64"] = None
            else:
                out[f.name] = _jsonable(v)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    return value


def to_json(value: Any) -> str:
    """JSON text for records: datetimes in ISO 8601, durations in seconds, bytes as
    ``<name>`` (printable text or null) plus ``<name>_base64``."""
    return json.dumps(_jsonable(value), indent=2, ensure_ascii=False)
