"""The task event stream: ``async for event in client.events(...)``.

Events (:data:`EVENT_KINDS`) go to one capped Redis stream, ``asyncq:events``
(asyncq-only; Go asynq never reads it), with ``XADD MAXLEN ~ N``: memory
stays bounded (about *N* entries, default :data:`DEFAULT_MAX_EVENTS`), any
number of readers each read it independently with XREAD, and a reader
resumes after the last :attr:`Event.id` it saw.

Who writes what:

- ``enqueued``: a :class:`~asyncq.Client` made with ``events=``;
  tasks enqueued by Go asynq (or a client without it) have none;
- ``started``, ``progress``, ``succeeded``, ``failed``, ``cancelled``,
  ``retried``, ``archived``: a :class:`~asyncq.Server` made with ``events=``
  (a failed attempt gives ``failed`` or ``cancelled``, then ``retried`` or
  ``archived``; a rate-limited task only ``retried``).

Each event names its task (``id``) and, for a workflow step, its workflow
(``workflow``: the step's ``asyncq-workflow`` header), so a reader follows one
task or one workflow (:func:`read_events`'s *task_ids* and *workflows*). The
events the recoverer writes for a dead worker's tasks carry no workflow id (it
reads the task's lease, not its headers).

Events are opt-in per queue (``events=True`` for every queue, or a list of
queue names and patterns) because they cost a stream write per event: see
docs/events.md for the measured cost. Writes are best effort: the events of
one event-loop turn go in one pipeline, and a write Redis refuses is logged
(debug) and dropped; the task itself is never affected.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from redis.exceptions import ResponseError

from asyncq._batch import TurnBatcher
from asyncq._broker.workflow import WORKFLOW_HEADER
from asyncq._cancel import raise_if_cancelling
from asyncq._keys import EVENTS_KEY
from asyncq._logging import LazyLogger
from asyncq._redis.options import RedisClient
from asyncq.errors import BrokerError, RateLimited, TaskCanceledError, find_error
from asyncq.hooks import WorkerHooks
from asyncq.mux import Handler
from asyncq.task import Task

__all__ = [
    "DEFAULT_MAX_EVENTS",
    "EVENTS_KEY",
    "EVENT_KINDS",
    "Event",
    "EventFilter",
    "EventHooks",
    "EventLog",
    "EventStore",
    "QueueFilter",
    "RecentEvents",
    "SkippedEvent",
    "decode_event",
    "event_queues",
    "log_skipped",
    "read_events",
    "recent_events",
    "stream_id",
]

DEFAULT_MAX_EVENTS = 100_000
"""About how many events the stream keeps (XADD MAXLEN ~)."""
EVENT_KINDS = (
    "enqueued",
    "started",
    "progress",
    "succeeded",
    "failed",
    "cancelled",
    "retried",
    "archived",
)

log: Any = LazyLogger()


@dataclass(frozen=True, slots=True)
class Event:
    """One task event. ``id`` is its stream ID: pass it as ``since=`` to resume after it."""

    id: str
    kind: str
    task_id: str
    type: str
    queue: str
    time: datetime
    error: str = ""
    fraction: float | None = None
    """``progress`` events: the reported fraction."""
    message: str = ""
    """``progress`` events: the reported message."""
    workflow: str = ""
    """The workflow the task is a step of ("" when none, or not known to the writer)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the web UI's event feed)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "task_id": self.task_id,
            "type": self.type,
            "queue": self.queue,
            "time": self.time.isoformat(),
            "error": self.error,
            "fraction": self.fraction,
            "message": self.message,
            "workflow": self.workflow,
        }


def event_queues(option: str, spec: object) -> bool | tuple[str, ...]:
    """The ``events`` setting checked: True, False or the queue names and patterns (a
    tuple); a bad one raises TypeError or ValueError naming *option*."""
    if isinstance(spec, bool):
        return spec
    if isinstance(spec, str):
        raise TypeError(f"{option} must be True, False or a list of queue names, not a str")
    if not isinstance(spec, Iterable):
        raise TypeError(
            f"{option} must be True, False or a list of queue names, got {spec.__class__.__name__}"
        )
    patterns = tuple(spec)
    for p in patterns:
        if not isinstance(p, str) or not p.strip():
            raise ValueError(f"{option} queue names must be non-blank strings, got {p!r}")
    return patterns


class QueueFilter:
    """Which queues have events: ``True`` (all), ``False`` (none) or names and patterns."""

    __slots__ = ("_all", "_known", "_patterns")

    _patterns: tuple[str, ...]

    def __init__(self, spec: bool | Iterable[str]) -> None:
        checked = event_queues("events", spec)
        if isinstance(checked, bool):
            self._all, self._patterns = checked, ()
        else:
            self._all, self._patterns = False, checked
        self._known: dict[str, bool] = {}

    @property
    def enabled(self) -> bool:
        """Whether any queue has events."""
        return self._all or bool(self._patterns)

    def __contains__(self, queue: object) -> bool:
        if self._all:
            return True
        if not isinstance(queue, str):
            return False
        hit = self._known.get(queue)
        if hit is None:
            hit = self._known[queue] = any(fnmatch.fnmatchcase(queue, p) for p in self._patterns)
        return hit


class EventStore(Protocol):
    """Where events go: the broker of the worker or Client that records them
    (:mod:`asyncq._broker.observations`)."""

    async def append_events(self, events: Sequence[Mapping[str, str]], max_events: int) -> None: ...


class EventLog:
    """Writes events of the chosen queues, one pipeline per event-loop turn."""

    __slots__ = ("_batch", "_maxlen", "_queues", "_store")

    def __init__(
        self, store: EventStore, queues: QueueFilter, *, max_events: int = DEFAULT_MAX_EVENTS
    ) -> None:
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be a positive int, got {max_events!r}")
        self._store = store
        self._queues = queues
        self._maxlen = max_events
        self._batch: TurnBatcher[dict[str, str]] = TurnBatcher(self._send)

    def add(self, kind: str, queue: str, task_type: str, task_id: str, **fields: str) -> None:
        """Queue one event (dropped when *queue* has no events). An empty ``workflow``
        field is left out: most tasks are no workflow's step."""
        if queue not in self._queues:
            return
        if "workflow" in fields and not fields["workflow"]:
            del fields["workflow"]
        self._batch.add({"kind": kind, "id": task_id, "type": task_type, "queue": queue, **fields})

    async def _send(self, batch: Sequence[dict[str, str]]) -> None:
        try:
            await self._store.append_events(batch, self._maxlen)
        except Exception as exc:
            log.debug("events not written", error=str(exc), count=len(batch))

    async def aclose(self) -> None:
        """Send what is pending and wait for the sends in flight."""
        await self._batch.aclose()


class EventHooks:
    """Worker hooks that write task events, around another observer (metrics)."""

    def __init__(self, inner: WorkerHooks, log_: EventLog) -> None:
        self._inner = inner
        self.log = log_
        # The workflow of each running step, from its headers when it started: the
        # outcome hooks get the task's id only (their signature is public).
        self._workflows: dict[str, str] = {}

    def instrument(self, handler: Handler) -> Handler:
        inner = self._inner.instrument(handler)
        add = self.log.add
        workflows = self._workflows

        async def started(task: Task) -> None:
            wid = task.headers.get(WORKFLOW_HEADER, "")
            if wid and task.id:
                workflows[task.id] = wid
            add("started", task.queue or "", task.type, task.id or "", workflow=wid)
            await inner(task)

        return started

    def attach(self) -> None:
        self._inner.attach()

    def detach(self) -> None:
        self._inner.detach()

    def task_retried(self, queue: str, task_type: str) -> None:
        self._inner.task_retried(queue, task_type)

    def task_archived(self, queue: str, task_type: str) -> None:
        self._inner.task_archived(queue, task_type)

    def lease_expired(self, queue: str, task_type: str) -> None:
        self._inner.lease_expired(queue, task_type)

    def loop_stalled(self, seconds: float) -> None:
        self._inner.loop_stalled(seconds)

    def task_finished(
        self,
        queue: str,
        task_type: str,
        task_id: str,
        outcome: str,
        *,
        error: str,
        exc: BaseException | None,
    ) -> None:
        self._inner.task_finished(queue, task_type, task_id, outcome, error=error, exc=exc)
        add = self.log.add
        wid = self._workflows.pop(task_id, "")  # the attempt is over: its next one starts anew
        if outcome in ("done", "complete", "revoke"):
            add("succeeded", queue, task_type, task_id, workflow=wid)
            return
        if outcome not in ("retry", "archive"):
            return
        if exc is not None and find_error(exc, RateLimited) is None:  # a real failure
            cancelled = isinstance(exc, TaskCanceledError | asyncio.CancelledError)
            kind = "cancelled" if cancelled else "failed"
            add(kind, queue, task_type, task_id, error=error, workflow=wid)
        kind = "retried" if outcome == "retry" else "archived"
        add(kind, queue, task_type, task_id, error=error, workflow=wid)


_REQUIRED = ("kind", "id", "type", "queue")
"""Fields every event has (``id``: the task's); an entry without one is not an event."""
_SHOWN = 40  # characters of a bad numeric value quoted in a skip notice
_LOGGED = 10  # skipped entries one warning line names (it gives the count of all)


@dataclass(frozen=True, slots=True)
class SkippedEvent:
    """A stream entry that is not a readable event (written by hand, by another program, or
    damaged): readers leave it out and name it with this instead of failing on it."""

    id: str
    """The entry's stream ID."""
    field: str
    """The field that could not be read."""
    problem: str
    """What is wrong with it, e.g. ``is 'nan', not a number between 0 and 1``."""

    @property
    def message(self) -> str:
        return f"event {self.id} skipped: field {self.field!r} {self.problem}"

    def as_dict(self) -> dict[str, str]:
        """JSON-ready form (the web UI's event feed)."""
        return {"id": self.id, "field": self.field, "problem": self.problem}


def _utf8(value: Any) -> str:
    """*value* as text; UnicodeDecodeError for bytes that are not UTF-8."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _fraction(raw: str) -> float | None:
    """A stored ``fraction``, or None unless it is a number in [0, 1] as progress() writes."""
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None  # NaN compares False: refused too


def decode_event(entry_id: Any, fields: Mapping[Any, Any]) -> Event | SkippedEvent:
    """One ``asyncq:events`` entry as an :class:`Event`, or a :class:`SkippedEvent` naming the
    first field that cannot be read. Every reader decodes here, so one bad entry (``fraction
    nan``, bytes that are not UTF-8, a missing field) never stops a reader."""
    ident = _utf8(entry_id)
    data: dict[str, str] = {}
    for key, value in fields.items():
        try:
            name = _utf8(key)
        except UnicodeDecodeError:
            return SkippedEvent(ident, repr(key), "is a field name that is not UTF-8")
        try:
            data[name] = _utf8(value)
        except UnicodeDecodeError:
            return SkippedEvent(ident, name, "is not UTF-8 text")
    for name in _REQUIRED:
        if not data.get(name):
            return SkippedEvent(ident, name, "is missing or empty")
    try:
        # Any XADD may give an explicit ID: up to 2**64 - 1 ms, past datetime's year 9999.
        at = datetime.fromtimestamp(int(ident.split("-", 1)[0]) / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return SkippedEvent(ident, "entry ID", "is not a time this reader can show")
    raw = data.get("fraction")
    fraction = None if raw is None else _fraction(raw)
    if raw is not None and fraction is None:
        return SkippedEvent(ident, "fraction", f"is {raw[:_SHOWN]!r}, not a number between 0 and 1")
    if data["kind"] == "progress" and fraction is None:
        return SkippedEvent(ident, "fraction", "is missing from a progress event")
    return Event(
        id=ident,
        kind=data["kind"],
        task_id=data["id"],
        type=data["type"],
        queue=data["queue"],
        time=at,
        error=data.get("error", ""),
        fraction=fraction,
        message=data.get("message", ""),
        workflow=data.get("workflow", ""),
    )


def log_skipped(skipped: Sequence[SkippedEvent]) -> None:
    """One warning line naming the entries a reader left out (nothing when there are none)."""
    if skipped:
        log.warning(
            "event stream entries skipped: not readable as events",
            key=EVENTS_KEY,
            count=len(skipped),
            entries=[s.message for s in skipped[:_LOGGED]],
        )


def _not_a_stream(exc: ResponseError) -> Exception:
    """The error a live reader raises when Redis refuses to read the stream: named by key
    (WRONGTYPE: the key holds another type, which no asyncq writer leaves)."""
    if "WRONGTYPE" not in str(exc):
        return exc
    return BrokerError(
        f"{EVENTS_KEY} holds another type than a stream, so no event can be read: {exc}"
    )


def stream_id(since: str | datetime | None) -> str:
    """XREAD's start ID for *since*: None (only new events), an event ID, or a time."""
    if since is None:
        return "$"
    if isinstance(since, datetime):
        if since.tzinfo is None:
            raise ValueError("since must be an aware datetime (e.g. datetime.now(UTC))")
        return f"{max(0, int(since.timestamp() * 1000) - 1)}-18446744073709551615"
    if isinstance(since, str):
        head, _, tail = since.partition("-")
        if since == "0" or (head.isdigit() and (not tail or tail.isdigit())):
            return since
        raise ValueError(f"since must be an event ID such as '1700000000000-0', got {since!r}")
    raise TypeError(f"since must be an event ID, a datetime or None, got {type(since).__name__}")


def _wanted(values: Collection[str] | None, name: str) -> frozenset[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        raise TypeError(f"{name} must be a collection of strings, not a str (wrap it in a list)")
    return frozenset(values)


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events a reader keeps: each field None (any) or the values wanted."""

    queues: frozenset[str] | None = None
    types: frozenset[str] | None = None
    kinds: frozenset[str] | None = None
    workflows: frozenset[str] | None = None
    task_ids: frozenset[str] | None = None

    @classmethod
    def of(
        cls,
        *,
        queues: Collection[str] | None = None,
        types: Collection[str] | None = None,
        kinds: Collection[str] | None = None,
        workflows: Collection[str] | None = None,
        task_ids: Collection[str] | None = None,
    ) -> EventFilter:
        """The filter checked: a str where a collection belongs, or an unknown kind, raises."""
        want_kinds = _wanted(kinds, "kinds")
        if want_kinds is not None:
            unknown = sorted(want_kinds - set(EVENT_KINDS))
            if unknown:
                raise ValueError(
                    f"unknown event kinds {unknown}; expected some of {list(EVENT_KINDS)}"
                )
        return cls(
            _wanted(queues, "queues"),
            _wanted(types, "types"),
            want_kinds,
            _wanted(workflows, "workflows"),
            _wanted(task_ids, "task_ids"),
        )

    def keeps(self, event: Event) -> bool:
        return (
            (self.queues is None or event.queue in self.queues)
            and (self.types is None or event.type in self.types)
            and (self.kinds is None or event.kind in self.kinds)
            and (self.workflows is None or event.workflow in self.workflows)
            and (self.task_ids is None or event.task_id in self.task_ids)
        )


def read_events(
    redis: RedisClient,
    *,
    queues: Collection[str] | None = None,
    types: Collection[str] | None = None,
    kinds: Collection[str] | None = None,
    workflows: Collection[str] | None = None,
    task_ids: Collection[str] | None = None,
    since: str | datetime | None = None,
    block: float = 1.0,
    batch: int = 500,
) -> AsyncIterator[Event]:
    """Yield events after *since*, waiting for new ones (XREAD BLOCK) without end.

    *block* is how long one read waits before the next: at most half the client's read
    timeout (redis-py's default is 5 s), so any *block* works on any client.

    *queues*, *types* (task types), *kinds* (:data:`EVENT_KINDS`), *workflows*
    (workflow ids: the events of their steps) and *task_ids* filter what is
    yielded (None: all; several filters: events matching all of them). The
    stream is one for every queue, so a filtered reader still reads every
    event and drops the others here. Bad filters or *since* raise here, not
    at the first iteration. An entry that is not a readable event
    (:class:`SkippedEvent`) is left out and named in a warning log line.
    """
    wanted = EventFilter.of(
        queues=queues, types=types, kinds=kinds, workflows=workflows, task_ids=task_ids
    )
    block_ms = max(1, int(min(block, _longest_block(redis)) * 1000))
    return _read(redis, wanted, stream_id(since), block_ms, batch)


_REDIS_PY_READ_TIMEOUT = 5.0
"""redis-py's read timeout for a connection given no ``socket_timeout`` (redis-py 8; before
it, none): an XREAD that blocks longer fails with "Timeout reading from ..."."""


def _longest_block(redis: RedisClient) -> float:
    """The longest one XREAD may block on *redis* (seconds): half its read timeout, so
    that a long *block* is read as several waits rather than failing, and the reply of
    each has the other half to arrive in on a busy machine."""
    kwargs = getattr(getattr(redis, "connection_pool", None), "connection_kwargs", None) or {}
    timeout = kwargs.get("socket_timeout") or _REDIS_PY_READ_TIMEOUT
    return float(timeout) / 2


async def _read(
    redis: RedisClient,
    wanted: EventFilter,
    last: str,
    block_ms: int,
    batch: int,
) -> AsyncIterator[Event]:
    try:
        if last == "$":  # pin "now" so that a reconnect does not skip what came meanwhile
            info: Any = await redis.xrevrange(EVENTS_KEY, count=1)
            last = _utf8(info[0][0]) if info else "0"
    except ResponseError as exc:
        raise _not_a_stream(exc) from exc
    while True:
        try:
            reply: Any = await redis.xread({EVENTS_KEY: last}, count=batch, block=block_ms)
        except ResponseError as exc:
            raise _not_a_stream(exc) from exc
        raise_if_cancelling()
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                event = decode_event(entry_id, fields)
                last = event.id
                if isinstance(event, SkippedEvent):
                    log_skipped([event])  # as it comes: the stream may never end
                    continue
                if wanted.keeps(event):
                    yield event


@dataclass(frozen=True, slots=True)
class RecentEvents:
    """What :func:`recent_events` read: the events, the entries it skipped, and the ID of
    the newest entry read (None: none), from which a next read resumes."""

    events: list[Event]
    skipped: list[SkippedEvent]
    last: str | None


async def recent_events(
    redis: RedisClient, *, count: int, after: str | None = None
) -> RecentEvents:
    """The newest *count* entries (oldest first), or those after the ID *after*, decoded;
    the unreadable ones are returned as skipped (the caller names them: :func:`log_skipped`)."""
    entries: Any
    try:
        if after:
            entries = await redis.xrange(EVENTS_KEY, min=f"({stream_id(after)}", count=count)
        else:
            entries = await redis.xrevrange(EVENTS_KEY, count=count)
            entries.reverse()
    except ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        # Nothing to show, but the page and its callers keep working (and say why).
        log.warning("ignored an asyncq key of the wrong type", key=EVENTS_KEY, expected="stream")
        return RecentEvents([], [], after)
    events: list[Event] = []
    skipped: list[SkippedEvent] = []
    for entry_id, fields in entries:
        decoded = decode_event(entry_id, fields)
        if isinstance(decoded, SkippedEvent):
            skipped.append(decoded)
        else:
            events.append(decoded)
    return RecentEvents(events, skipped, _utf8(entries[-1][0]) if entries else None)
