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

from asyncq._batch import TurnBatcher
from asyncq._keys import EVENTS_KEY
from asyncq._logging import get_logger
from asyncq._redis.options import RedisClient
from asyncq.errors import RateLimited, TaskCanceledError, find_error
from asyncq.hooks import WorkerHooks
from asyncq.mux import Handler
from asyncq.task import Task

__all__ = [
    "DEFAULT_MAX_EVENTS",
    "EVENTS_KEY",
    "EVENT_KINDS",
    "Event",
    "EventHooks",
    "EventLog",
    "EventStore",
    "QueueFilter",
    "event_queues",
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

log = get_logger()


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
        """Queue one event (dropped when *queue* has no events)."""
        if queue not in self._queues:
            return
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

    def instrument(self, handler: Handler) -> Handler:
        inner = self._inner.instrument(handler)
        add = self.log.add

        async def started(task: Task) -> None:
            add("started", task.queue or "", task.type, task.id or "")
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
        if outcome in ("done", "complete", "revoke"):
            add("succeeded", queue, task_type, task_id)
            return
        if outcome not in ("retry", "archive"):
            return
        if exc is not None and find_error(exc, RateLimited) is None:  # a real failure
            cancelled = isinstance(exc, TaskCanceledError | asyncio.CancelledError)
            add("cancelled" if cancelled else "failed", queue, task_type, task_id, error=error)
        add("retried" if outcome == "retry" else "archived", queue, task_type, task_id, error=error)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _event(entry_id: Any, fields: dict[Any, Any]) -> Event:
    data = {_text(k): _text(v) for k, v in fields.items()}
    ident = _text(entry_id)
    ms = int(ident.split("-", 1)[0])
    fraction = data.get("fraction")
    return Event(
        id=ident,
        kind=data.get("kind", ""),
        task_id=data.get("id", ""),
        type=data.get("type", ""),
        queue=data.get("queue", ""),
        time=datetime.fromtimestamp(ms / 1000, UTC),
        error=data.get("error", ""),
        fraction=None if fraction is None else float(fraction),
        message=data.get("message", ""),
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


def read_events(
    redis: RedisClient,
    *,
    queues: Collection[str] | None = None,
    types: Collection[str] | None = None,
    kinds: Collection[str] | None = None,
    since: str | datetime | None = None,
    block: float = 1.0,
    batch: int = 500,
) -> AsyncIterator[Event]:
    """Yield events after *since*, waiting for new ones (XREAD BLOCK) without end.

    *queues*, *types* (task types) and *kinds* (:data:`EVENT_KINDS`) filter
    what is yielded (None: all). Bad filters or *since* raise here, not at
    the first iteration.
    """
    want_kinds = _wanted(kinds, "kinds")
    if want_kinds is not None:
        unknown = sorted(want_kinds - set(EVENT_KINDS))
        if unknown:
            raise ValueError(f"unknown event kinds {unknown}; expected some of {list(EVENT_KINDS)}")
    wanted = (_wanted(queues, "queues"), _wanted(types, "types"), want_kinds)
    return _read(redis, wanted, stream_id(since), max(1, int(block * 1000)), batch)


async def _read(
    redis: RedisClient,
    wanted: tuple[frozenset[str] | None, frozenset[str] | None, frozenset[str] | None],
    last: str,
    block_ms: int,
    batch: int,
) -> AsyncIterator[Event]:
    want_queues, want_types, want_kinds = wanted
    if last == "$":  # pin "now" so that a reconnect does not skip what came meanwhile
        info: Any = await redis.xrevrange(EVENTS_KEY, count=1)
        last = _text(info[0][0]) if info else "0"
    while True:
        reply: Any = await redis.xread({EVENTS_KEY: last}, count=batch, block=block_ms)
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                event = _event(entry_id, fields)
                last = event.id
                if want_queues is not None and event.queue not in want_queues:
                    continue
                if want_types is not None and event.type not in want_types:
                    continue
                if want_kinds is not None and event.kind not in want_kinds:
                    continue
                yield event


async def recent_events(redis: RedisClient, *, count: int, after: str | None = None) -> list[Event]:
    """The newest *count* events (oldest first), or those after the ID *after*."""
    if after:
        entries: Any = await redis.xrange(EVENTS_KEY, min=f"({stream_id(after)}", count=count)
        return [_event(i, f) for i, f in entries]
    entries = await redis.xrevrange(EVENTS_KEY, count=count)
    return [_event(i, f) for i, f in reversed(entries)]
