"""The Inspector's records: what its reads return (queues, servers, schedulers, workflows,
durable runs, error groups), as frozen dataclasses users receive from :class:`asyncq.Inspector`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from asyncq._broker._base import ARCHIVE_MAX_SIZE
from asyncq._errsig import ErrorSignature

__all__ = [
    "ARCHIVE_LIMIT",
    "ArchiveReport",
    "ClusterNode",
    "DailyStats",
    "DurableEntry",
    "DurableRunInfo",
    "DurableRunPage",
    "DurableRunSummary",
    "DurableWait",
    "ErrorGroup",
    "ErrorGroupResult",
    "ErrorReport",
    "GroupInfo",
    "QueueInfo",
    "SchedulerEnqueueEvent",
    "SchedulerEntry",
    "ServerInfo",
    "SkippedQueue",
    "TypeRateInfo",
    "WorkerInfo",
    "WorkflowPage",
    "WorkflowSummary",
    "per_second_of",
]


@dataclass(frozen=True, slots=True)
class WorkflowSummary:
    """One row of :meth:`Inspector.workflows`: a workflow without its steps' results.

    *kind*: ``group`` (one stage of several tasks), ``chord`` (a group, then one
    task), else ``chain``. *steps_done* counts the steps that succeeded, failed or
    were canceled, out of *steps_total*.
    """

    id: str
    queue: str
    kind: str
    state: str
    steps_done: int
    steps_total: int
    created: datetime
    finished: datetime | None


@dataclass(frozen=True, slots=True)
class WorkflowPage:
    """A page of :meth:`Inspector.workflows`; *cursor* gets the next one (None: no more)."""

    workflows: list[WorkflowSummary]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A snapshot of one queue (asynq's QueueInfo)."""

    queue: str
    memory_usage: int
    """Approximate bytes used by the queue's tasks (sampled, asynq's estimate)."""
    latency: timedelta
    """Age of the oldest pending task (0 when none or when it has no pending_since)."""
    size: int
    """Tasks in every state, completed and aggregating included."""
    groups: int
    pending: int
    active: int
    scheduled: int
    retry: int
    archived: int
    completed: int
    aggregating: int
    processed: int
    """Tasks processed today (UTC), successes and failures."""
    failed: int
    """Tasks failed today (UTC)."""
    processed_total: int
    failed_total: int
    paused: bool
    timestamp: datetime
    """When the snapshot was taken."""
    concurrency_limit: int | None = None
    """asyncq: the fleet-wide concurrency limit stored in Redis (:meth:`Inspector.set_limit`),
    else the ``queue_concurrency`` live servers configure (the smallest when they differ;
    see :attr:`configured_by`); None when neither."""
    running: int = 0
    """asyncq: active tasks holding a live lease, what a concurrency limit counts."""
    held_back: int = 0
    """asyncq: pending tasks the stored limit keeps waiting now (pending beyond the room)."""
    rate_limit: str | None = None
    """asyncq: the rate the workers' ``rate_limits`` bucket runs at (e.g. ``"50/s"``), as
    last written by a worker that took a task (kept an hour), else the rate live servers
    configure; None when neither."""
    rate_tokens: int | None = None
    """asyncq: tasks the rate bucket lets start now (Redis TIME); None without a bucket."""
    ordered: bool = False
    """asyncq: the queue is ordered (:meth:`Inspector.set_ordered`, or a live server's
    ``ordered_queues``)."""
    configured_by: dict[str, dict[str, int]] = field(default_factory=dict)
    """asyncq: what live servers configure for the queue by code or flag, and how many
    of them: ``{"limit": {"2": 3}, "rate": {"10/s burst 1": 3}, "local": {"4": 1},
    "ordered": {"yes": 3}}`` (settings nobody configures are absent; a pattern
    such as ``tenant:*`` counts for each queue it matches)."""

    @property
    def configured_text(self) -> str:
        """asyncq: :attr:`configured_by` in words (``"limit 2 (3 servers), rate 10/s (3
        servers)"``; empty when no live server configures anything for the queue)."""
        names = {"limit": "limit", "local": "local limit", "rate": "rate", "ordered": "ordered"}
        parts = []
        for setting, label in names.items():
            for value, n in sorted(self.configured_by.get(setting, {}).items()):
                shown = label if setting == "ordered" else f"{label} {value}"
                parts.append(f"{shown} ({n} server{'s' if n != 1 else ''})")
        return ", ".join(parts)

    @property
    def rate_per_second(self) -> float | None:
        """asyncq: :attr:`rate_limit` in tasks per second (``"600/min"`` is 10.0)."""
        return None if self.rate_limit is None else per_second_of(self.rate_limit)


ARCHIVE_LIMIT = ARCHIVE_MAX_SIZE - 1
"""Tasks an archive keeps (asynq's cap): archiving more deletes the oldest archived ones."""


@dataclass(frozen=True, slots=True)
class ArchiveReport:
    """What :meth:`Inspector.archive_all_report` did.

    *moved*: tasks taken out of their state into the archive. *deleted*: archived
    tasks (of this call or earlier, oldest first) that the archive's limits then
    deleted: it keeps at most 9,999 tasks (asynq's cap) and none archived more
    than 90 days ago.
    """

    moved: int
    deleted: int

    @property
    def deleted_note(self) -> str:
        """``"; the archive keeps ... deleted"`` when the limits deleted tasks, else ``""``."""
        if not self.deleted:
            return ""
        return (
            f"; the archive keeps at most {ARCHIVE_LIMIT:,} tasks (none older than 90 "
            f"days), so {self.deleted} of the oldest archived tasks were deleted"
        )

    @property
    def message(self) -> str:
        """A sentence saying what happened, deletions included."""
        return f"{self.moved} task{'' if self.moved == 1 else 's'} archived{self.deleted_note}"


@dataclass(frozen=True, slots=True)
class SkippedQueue:
    """A member of ``asynq:queues`` that is not a usable queue name, left out of every view.

    *name* is the stored name as text (bytes that are not UTF-8 shown as ``\\xNN``),
    *reason* why it is unusable, *message* a sentence naming the key, for logs and pages.
    """

    name: str
    reason: str

    @property
    def message(self) -> str:
        if self.reason.startswith("Redis refused"):
            return f"queue {self.name!r} is left out: {self.reason}"
        return (
            f"asynq:queues holds {self.name!r}, which is not a usable queue name "
            f"({self.reason}); it is left out (remove it with SREM asynq:queues)"
        )


@dataclass(frozen=True, slots=True)
class DailyStats:
    """Processed and failed counts of one UTC day."""

    queue: str
    processed: int
    failed: int
    date: date


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """An aggregation group and the number of tasks waiting in it."""

    group: str
    size: int


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A task being processed by a server."""

    task_id: str
    task_type: str
    task_payload: bytes
    queue: str
    started: datetime | None
    deadline: datetime | None


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """A live worker server (Go asynq or asyncq) and the tasks it is running."""

    id: str
    host: str
    pid: int
    concurrency: int
    queues: dict[str, int]
    strict_priority: bool
    started: datetime | None
    status: str
    active_workers: list[WorkerInfo] = field(default_factory=list)
    type_rate_limits: dict[str, str] = field(default_factory=dict)
    """asyncq: the server's ``type_rate_limits`` (``{task type: "600/min"}``); empty for
    Go asynq servers and asyncq servers without any."""
    queue_concurrency: dict[str, int] = field(default_factory=dict)
    """asyncq: the server's ``queue_concurrency`` (names or patterns, as configured)."""
    local_queue_concurrency: dict[str, int] = field(default_factory=dict)
    """asyncq: the server's ``local_queue_concurrency``."""
    rate_limits: dict[str, str] = field(default_factory=dict)
    """asyncq: the server's ``rate_limits`` (``{queue: "10/s burst 1"}``)."""
    ordered_queues: list[str] = field(default_factory=list)
    """asyncq: the server's ``ordered_queues``."""


@dataclass(frozen=True, slots=True)
class TypeRateInfo:
    """asyncq: one task type's fleet-wide rate limit (``Limits(type_rate_limits=...)``).

    A type is known from the live servers that configure it and from its
    Redis bucket, which the first token taken creates and which expires an
    hour after it was last full.
    """

    task_type: str
    rate: str | None
    """The rate the bucket runs at, as last written by a worker that took a token
    (e.g. ``"600/min"``); without a bucket, the rate the live servers configure
    (the first, sorted, when they disagree); None when neither is known."""
    per_second: float | None
    """:attr:`rate` in tasks per second (``"600/min"`` is 10.0)."""
    tokens: int | None
    """Tasks of the type that may start now (Redis TIME); None without a bucket."""
    next_token: timedelta | None
    """When :attr:`tokens` is 0, how long until the next token; else 0; None
    without a bucket."""
    limited: int
    """Tasks the rate put back to the retry set (unrun, no retry used) since the
    bucket was created; 0 without a bucket."""
    servers: dict[str, int] = field(default_factory=dict)
    """Live servers configuring the type, by the rate they configure
    (``{"600/min": 3}``); more than one key means they disagree, and the bucket
    runs at whichever rate its last taker had."""


@dataclass(frozen=True, slots=True)
class SchedulerEntry:
    """A periodic task registered by a live scheduler.

    ``options`` are the option strings exactly as the scheduler stored them,
    in Go syntax (``Queue("critical")``, ``MaxRetry(3)``, ``Timeout(30m0s)``...).
    """

    id: str
    spec: str
    task_type: str
    task_payload: bytes
    options: list[str]
    next: datetime | None
    prev: datetime | None
    """None when the entry has never enqueued a task."""


@dataclass(frozen=True, slots=True)
class SchedulerEnqueueEvent:
    """One task enqueued by a scheduler entry."""

    task_id: str
    enqueued_at: datetime | None


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """A Redis Cluster node serving a queue's slot."""

    id: str
    addr: str


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    """asyncq: failed tasks sharing one error signature (:meth:`Inspector.error_groups`).

    The signature is the exception type and the message with numbers, hex ids,
    UUIDs, addresses and quoted strings folded (``KeyError: '<str>'``; the quoted name
    of a field, argument and the like is kept), so 4,800 failures of one cause form
    one group whatever ids their messages carry.
    """

    key: str
    """A short stable id of the signature (12 hex digits): pass it to the group actions."""
    kind: str
    """The exception class (``"ConnectionError"``); empty when the error names none."""
    message: str
    """The normalised message."""
    example: str
    """The newest error text of the group, as stored."""
    count: int
    first_seen: datetime | None
    """The earliest failure (``last_failed_at``; for archived tasks without one, the
    archive time)."""
    last_seen: datetime | None
    task_types: dict[str, int]
    """Tasks per task type, most first."""
    queues: dict[str, int]
    """Tasks per queue, most first."""
    states: dict[str, int]
    """Tasks per state (``"retry"``, ``"archived"``)."""
    sample: list[tuple[str, str]] = field(default_factory=list)
    """Up to five ``(queue, task id)`` of the newest tasks of the group."""

    @property
    def signature(self) -> str:
        """``"<kind>: <message>"`` (either part alone when the other is empty)."""
        return str(ErrorSignature(self.kind, self.message))


@dataclass(frozen=True, slots=True)
class ErrorReport:
    """asyncq: failed tasks grouped by error signature, largest group first."""

    groups: list[ErrorGroup]
    scanned: int
    """Tasks read (at most the ``limit`` given)."""
    total: int
    """Tasks in the scanned states of the scanned queues when the scan started."""

    @property
    def capped(self) -> bool:
        """True when the limit stopped the scan before every task was read."""
        return self.scanned < self.total


@dataclass(frozen=True, slots=True)
class ErrorGroupResult:
    """asyncq: what a bulk action on an error group did."""

    acted: int
    """Tasks run, archived or deleted."""
    skipped: int
    """Tasks of the group that moved or failed again with another error between the
    read and the action, left alone."""


_PERIOD_S = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_PERIOD_S |= {"h": 3600.0, "hour": 3600.0}


def per_second_of(rate: str) -> float | None:
    """Tasks per second of a rate text a server wrote (``"600/min"`` is 10.0); None
    for text that is not a rate (a record written by something else)."""
    count, _, period = rate.partition("/")
    period, _, _ = period.strip().partition(" burst ")  # "10/s burst 1": the burst is no rate
    try:
        n = int(count)
    except ValueError:
        return None
    seconds = _PERIOD_S.get(period.strip().lower())
    if seconds is None:
        try:
            seconds = float(period.removesuffix("s"))  # _rate_text's "7/2.5s"
        except ValueError:
            return None
    return n / seconds if seconds > 0 else None


@dataclass(frozen=True, slots=True)
class DurableEntry:
    """One entry of a durable run's record (:meth:`Inspector.get_durable_run`), in order.

    *kind*: ``step``, ``call``, ``sleep``, ``wait``, ``now`` or ``uuid`` (the first word
    of *signature*, what the function asked for there). *step_id*: a step's task id
    (``<run id>-<index>``). *result*: the recorded JSON (``b""`` for a wait that timed
    out), None when not recorded; *error*: a failed step's error. *deadline*: a sleep's
    end or a wait's timeout. *waited_for*: the run waits for this entry now.
    """

    index: int
    kind: str
    signature: str
    step_id: str | None
    result: bytes | None
    error: str | None
    deadline: datetime | None
    waited_for: bool

    @property
    def recorded(self) -> bool:
        """Whether the entry's outcome (result or error) is recorded."""
        return self.result is not None or self.error is not None


@dataclass(frozen=True, slots=True)
class DurableWait:
    """What a waiting durable run waits for: ``steps`` (their indices), a ``signal``
    (its name and key) or a ``sleep``; *until*: when time alone resumes it (None: only
    the steps or the signal can)."""

    kind: str
    steps: tuple[int, ...] = ()
    signal_name: str | None = None
    signal_key: str | None = None
    until: datetime | None = None

    def describe(self) -> str:
        """One line: ``steps 3, 4``, ``signal email:opened / 42``, ``sleep``."""
        if self.kind == "steps":
            return "steps " + ", ".join(str(i) for i in self.steps)
        if self.kind == "signal":
            return f"signal {self.signal_name} / {self.signal_key}"
        return self.kind


@dataclass(frozen=True, slots=True)
class DurableRunInfo:
    """A durable run (:meth:`Inspector.get_durable_run`): its record's entries and its task.

    *state*: ``pending`` (started, no attempt yet: no entries), ``running`` (an attempt
    runs, or the run waits in its queue for its next one), ``waiting``, ``completed``,
    ``failed`` or ``cancelled``. *type*: the function's task type (None
    when its task is gone). *task_state*: its task's state (None: gone). *waiting_for*:
    what it waits for (None unless waiting). *updated*: when its task last completed or
    failed (None: neither yet). *last_error*: its task's last error.
    """

    id: str
    queue: str
    type: str | None
    state: str
    task_state: str | None
    entries: list[DurableEntry]
    waiting_for: DurableWait | None
    next_process_at: datetime | None
    updated: datetime | None
    last_error: str | None

    @property
    def steps_total(self) -> int:
        return sum(e.kind == "step" for e in self.entries)

    @property
    def steps_done(self) -> int:
        return sum(e.kind == "step" and e.recorded for e in self.entries)


@dataclass(frozen=True, slots=True)
class DurableRunSummary:
    """One row of :meth:`Inspector.durable_runs`: a run without its entries."""

    id: str
    queue: str
    type: str | None
    state: str
    waiting_for: DurableWait | None
    entries: int
    steps_done: int
    steps_total: int
    updated: datetime | None


@dataclass(frozen=True, slots=True)
class DurableRunPage:
    """A page of :meth:`Inspector.durable_runs`; *cursor* gets the next one (None: no more)."""

    runs: list[DurableRunSummary]
    cursor: str | None
