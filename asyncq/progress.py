"""Progress of a running task: ``asyncq.progress(0.4, "rows 400/1000")`` inside a handler.

The handler reports through a context accessor rather than an argument or a
method of its task: plain handlers receive a :class:`~asyncq.Task` but typed
handlers (``@app.task``) receive their own arguments, and the code that knows
how far an import is often sits several calls below the handler. A
ContextVar set around each call reaches all of them, in any helper, without
changing a signature (the same reason as :func:`asyncq.current_task`).

Storage, asyncq-only (Go asynq and asynqmon never read it; the task hash is
untouched):

- a hash ``asyncq:{queue}:progress:<task id>`` with ``fraction``, ``message``
  and ``time`` (same hash slot as the queue's keys);
- it expires with the task: while the attempt runs its TTL is the attempt's
  deadline plus :data:`KEEP_AFTER_FAILURE`; when the handler succeeds it takes
  the task's retention (the task hash expires then too) or is deleted when the
  task has none (asynq deletes the task hash then); after a failed attempt it
  stays :data:`KEEP_AFTER_FAILURE`; :meth:`asyncq.Inspector.delete_task`
  deletes it with the task;
- each write PUBLISHes the update on :func:`progress_channel` (one channel per
  queue) so producers stream it (``handle.progress()``) without polling.

Writes are rate-limited per task: at most one every :data:`MIN_INTERVAL`
(100 ms); a report inside the window replaces the pending one, which is
written when the window ends, and the last report is always written when
the handler returns. A handler calling ``progress`` in a tight loop thus
costs at most 10 round trips a second (one pipeline each) plus the final one.
A handler that never reports costs one ContextVar set and reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from datetime import timedelta
from typing import Any, Protocol

from redis.exceptions import ResponseError

from asyncq._keys import completion_channel, progress_channel, progress_key
from asyncq._logging import LazyLogger, get_logger
from asyncq._redis.options import RedisClient
from asyncq.task import Task, TaskProgress, TaskState

__all__ = [
    "KEEP_AFTER_FAILURE",
    "MAX_MESSAGE_LENGTH",
    "MIN_INTERVAL",
    "EagerProgress",
    "ProgressStore",
    "ProgressWriter",
    "parse_progress",
    "progress",
    "progress_channel",
    "progress_key",
    "progress_of",
    "read_progress",
    "settled",
    "watch_progress",
]

MIN_INTERVAL = 0.1
"""Least seconds between two progress writes of one task (the last report is always written)."""
KEEP_AFTER_FAILURE = timedelta(hours=24)
"""How long the progress of an attempt that failed (or whose worker died) is kept."""
MAX_MESSAGE_LENGTH = 1024
"""Longest progress message, in characters."""

log = get_logger()
_stored_log = LazyLogger()  # the readers' warnings: the application's setup applies


class EventSink(Protocol):
    """Where a progress update also goes as an event (:class:`asyncq.events.EventLog`)."""

    def add(self, kind: str, queue: str, task_type: str, task_id: str, **fields: str) -> None: ...


def _check(fraction: float, message: str) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise TypeError(f"progress fraction must be a number, got {type(fraction).__name__}")
    if math.isnan(fraction) or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"progress fraction must be between 0 and 1, got {fraction!r}")
    if not isinstance(message, str):
        raise TypeError(f"progress message must be a str, got {type(message).__name__}")
    if len(message) > MAX_MESSAGE_LENGTH:
        raise ValueError(
            f"progress message is {len(message)} characters; at most {MAX_MESSAGE_LENGTH}"
        )
    try:
        message.encode()
    except UnicodeEncodeError as exc:
        # Refused here, where the caller can fix it: the write, in the background later,
        # could only drop it. A lone surrogate is what os.fsdecode or a
        # errors="surrogateescape" decode leaves for bytes that are not UTF-8.
        bad = message[exc.start : exc.end]
        raise ValueError(
            f"progress message holds {bad!r} at index {exc.start}: lone surrogates, which "
            "UTF-8 cannot encode; decode the text with errors='replace', or pass repr() of it"
        ) from None
    return float(fraction)


Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]
"""Starts a write as a task of the TaskGroup that runs the handlers (the processor's)."""


class ProgressStore(Protocol):
    """Where a worker writes progress: its broker (:mod:`asyncq._broker.observations`)."""

    async def write_progress(
        self, queue: str, task_id: str, fields: Mapping[str, str], ttl_ms: int, update: str
    ) -> None: ...

    async def expire_progress(self, queue: str, task_id: str, ttl_ms: int) -> None: ...


class _Reporter:
    """One running task's rate-limited progress (created on its first report)."""

    __slots__ = ("flush_handle", "last_write", "loop", "pending", "task", "writer")

    def __init__(self, writer: ProgressWriter, task: Task, loop: asyncio.AbstractEventLoop) -> None:
        self.writer = writer
        self.task = task
        self.loop = loop
        self.pending: tuple[float, str, float] | None = None
        self.last_write = -math.inf
        self.flush_handle: asyncio.TimerHandle | None = None

    def report(self, fraction: float, message: str) -> None:
        """On the loop: keep the latest value; write now or when the window ends."""
        self.pending = (fraction, message, time.time())
        if self.flush_handle is not None:
            return  # the scheduled flush writes the latest value
        wait = self.last_write + MIN_INTERVAL - self.loop.time()
        if wait <= 0:
            self.flush()
        else:
            self.flush_handle = self.loop.call_later(wait, self.flush)

    def flush(self, final_ttl: float | None = None) -> None:
        self.flush_handle = None
        value, self.pending = self.pending, None
        if value is None:
            return
        self.last_write = self.loop.time()
        self.writer.write(self.task, value, final_ttl)


class _Reporting(Protocol):
    """Where :func:`progress` hands a report: a worker's writer, or eager mode's record."""

    def report(self, task: Task, fraction: float, message: str) -> None: ...


_current: contextvars.ContextVar[tuple[_Reporting, Task] | None] = contextvars.ContextVar(
    "asyncq_progress", default=None
)


def progress(fraction: float, message: str = "") -> None:
    """Report how far the running task is: *fraction* in [0, 1] and a short *message*.

    Call it from a handler (plain or typed, or any function it calls, also in
    a thread started with ``asyncio.to_thread``). It returns at once; the
    value is written to Redis in the background, at most every 100 ms per
    task (the last value always). Raises RuntimeError outside a task handler,
    TypeError/ValueError for a fraction outside [0, 1], a message longer
    than :data:`MAX_MESSAGE_LENGTH` or one UTF-8 cannot encode (a lone surrogate
    such as ``"\\udcff"``).
    """
    value = _check(fraction, message)
    current = _current.get()
    if current is None:
        raise RuntimeError("asyncq.progress() is only available inside a task handler")
    writer, task = current
    writer.report(task, value, message)


class EagerProgress:
    """Eager mode (``App.eager()``): one task's reports, kept in memory in order.

    Eager runs are task runs, so a handler's :func:`progress` must work there as
    under a worker; nothing goes to Redis, and the handle replays the reports
    (``handle.progress()``). Every report is kept: a test asserts what the
    handler reported, and the worker's rate limit exists for Redis's sake.
    """

    __slots__ = ("_open", "reports")

    def __init__(self) -> None:
        self.reports: list[TaskProgress] = []
        self._open = False

    def begin(self, task: Task) -> contextvars.Token[tuple[_Reporting, Task] | None]:
        """*task*'s handler starts: :func:`progress` records here until :meth:`end`."""
        self._open = True
        return _current.set((self, task))

    def end(self, token: contextvars.Token[tuple[_Reporting, Task] | None]) -> None:
        """The handler is over: later reports (from a thread it left behind) are dropped,
        as a worker drops them."""
        self._open = False
        _current.reset(token)

    def report(self, task: Task, fraction: float, message: str) -> None:
        # list.append is atomic, so a report from a handler's thread needs no lock.
        if self._open:
            self.reports.append(TaskProgress.of(fraction, message, time.time()))


class ProgressWriter:
    """Worker side: makes :func:`progress` available to a running handler, and writes
    the reports."""

    def __init__(self, store: ProgressStore, events: EventSink | None = None) -> None:
        self._store = store
        self._events = events
        self._reporters: dict[str, _Reporter] = {}
        self._running: set[str] = set()  # IDs of the tasks whose handler runs now
        self._sending: set[asyncio.Future[None]] = set()
        self._last: dict[str, asyncio.Future[None]] = {}  # per task: its latest write
        self._loop: asyncio.AbstractEventLoop | None = None
        self._spawn: Spawn | None = None

    def begin(self, task: Task, spawn: Spawn) -> None:
        """*task*'s handler starts: :func:`progress` reports for it from here on.

        Called by the worker in the task's own asyncio task, just before the handler:
        the context variable set here is that task's (and the threads' it starts), so
        it needs no reset, and an unused progress costs no wrapper around the handler.
        Its writes are tasks of the group *spawn* starts them in, the processor's:
        every write is started while the task's coroutine runs (a report after the
        handler returned is dropped), so leaving that group waits for them.
        """
        self._spawn = spawn
        _current.set((self, task))
        self._running.add(task.id or "")

    def end(self, task: Task, ok: bool) -> None:
        """*task*'s handler is over (*ok*: it returned): the last report is written with
        the task's final lifetime; later reports (from a thread it left behind) are
        dropped."""
        task_id = task.id or ""
        self._running.discard(task_id)
        if task_id in self._reporters:
            self._finished(task, ok)

    def report(self, task: Task, fraction: float, message: str) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # a thread of the handler's (asyncio.to_thread)
            if self._loop is None:
                raise RuntimeError("asyncq.progress() found no running worker") from None
            self._loop.call_soon_threadsafe(self._report, task, fraction, message)
            return
        self._report(task, fraction, message)

    def _report(self, task: Task, fraction: float, message: str) -> None:
        assert task.id is not None and self._loop is not None
        reporter = self._reporters.get(task.id)
        if reporter is None:
            if task.id not in self._running:
                return  # from a thread, after the handler returned: the final value is written
            reporter = self._reporters[task.id] = _Reporter(self, task, self._loop)
        reporter.report(fraction, message)

    def _finished(self, task: Task, ok: bool) -> None:
        assert task.id is not None
        reporter = self._reporters.pop(task.id)
        if reporter.flush_handle is not None:
            reporter.flush_handle.cancel()
        msg = task._message
        retention = msg.retention if msg is not None else 0
        # Success: the progress lives as long as the completed task (0: deleted with it).
        final = float(retention) if ok else KEEP_AFTER_FAILURE.total_seconds()
        if reporter.pending is None:
            self._send(task, self._expire(task, final))
        else:
            reporter.flush(final)

    def write(self, task: Task, value: tuple[float, str, float], final_ttl: float | None) -> None:
        if self._events is not None and task.id is not None and task.queue is not None:
            # Imported here: `import asyncq` imports this module, and must not load the
            # broker (a web app that only enqueues; tests/app/test_console.py).
            from asyncq._broker.workflow import WORKFLOW_HEADER

            # Queued now, so it precedes the task's outcome event in the stream.
            fraction, message, _ = value
            self._events.add(
                "progress", task.queue, task.type, task.id, fraction=repr(fraction),
                message=message, workflow=task.headers.get(WORKFLOW_HEADER, ""),
            )  # fmt: skip
        self._send(task, self._write(task, value, final_ttl))

    def _send(self, task: Task, write: Coroutine[Any, Any, None]) -> None:
        # One task's writes go one after the other: two in flight on two connections
        # could land in either order and leave an older value stored.
        assert task.id is not None
        previous = self._last.get(task.id)
        assert self._spawn is not None  # begin() came first: reports are taken from there on
        sending = self._spawn(self._after(previous, write))
        self._last[task.id] = sending
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)
        sending.add_done_callback(lambda done: self._forget(task.id, done))

    @staticmethod
    async def _after(
        previous: asyncio.Future[None] | None, write: Coroutine[Any, Any, None]
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        await write

    def _forget(self, task_id: str | None, done: asyncio.Future[None]) -> None:
        if task_id is not None and self._last.get(task_id) is done:
            del self._last[task_id]

    def _ttl(self, task: Task, final_ttl: float | None) -> float:
        if final_ttl is not None:
            return final_ttl
        deadline = task._deadline_ts
        left = 0.0 if deadline is None else max(0.0, deadline - time.time())
        return left + KEEP_AFTER_FAILURE.total_seconds()

    async def _write(
        self, task: Task, value: tuple[float, str, float], final_ttl: float | None
    ) -> None:
        assert task.id is not None and task.queue is not None
        fraction, message, when = value
        ttl_ms = int(self._ttl(task, final_ttl) * 1000)
        update = json.dumps(
            {"id": task.id, "fraction": fraction, "message": message, "time": when},
            ensure_ascii=False,
        )
        fields = {"fraction": repr(fraction), "message": message, "time": repr(when)}
        try:
            await self._store.write_progress(task.queue, task.id, fields, ttl_ms, update)
        except Exception as exc:
            log.debug("progress not written", task_id=task.id, error=str(exc))

    async def _expire(self, task: Task, ttl: float) -> None:
        assert task.id is not None and task.queue is not None
        try:
            await self._store.expire_progress(task.queue, task.id, int(ttl * 1000))
        except Exception as exc:
            log.debug("progress expiry not set", task_id=task.id, error=str(exc))

    async def aclose(self) -> None:
        """Wait for the writes in flight (none is left once their group has ended)."""
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def parse_progress(fields: dict[Any, Any], key: str = "") -> TaskProgress | None:
    """A stored progress hash as a TaskProgress (None when empty or unreadable).

    What a worker never writes (a fraction outside 0..1 or not finite, a time a
    datetime cannot hold, a missing field) reads as no progress, with a warning
    naming *key*: shown as a number it would fail the page or the command that
    reads it, or claim a task is 300 % done.
    """
    if not fields:
        return None
    data = {_text(k): _text(v) for k, v in fields.items()}
    try:
        fraction, unix = float(data["fraction"]), float(data["time"])
        if not (0.0 <= fraction <= 1.0 and math.isfinite(unix)):
            raise ValueError("out of range")
        return TaskProgress.of(fraction, data.get("message", ""), unix)
    except (KeyError, ValueError, OverflowError, OSError) as exc:
        _stored_log.warning(
            "ignored an unreadable stored progress",
            key=key,
            error=f"{type(exc).__name__}: {exc}"[:120],
            value=repr(fields)[:120],
        )
        return None


async def read_progress(redis: RedisClient, queue: str, task_id: str) -> TaskProgress | None:
    """The task's last stored progress, or None (also, with a warning naming the key,
    when the key holds another type than a hash)."""
    key = progress_key(queue, task_id)
    fields: Any
    try:
        fields = await redis.hgetall(key)
    except ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        fields = exc
    return progress_of(fields, key)


def progress_of(reply: Any, key: str) -> TaskProgress | None:
    """*reply* to HGETALL of the progress *key* (or the error a pipeline returned for it)
    as a TaskProgress: an error is warned about with the key and reads as none."""
    if isinstance(reply, ResponseError):
        if "WRONGTYPE" not in str(reply):
            raise reply
        _stored_log.warning("ignored an asyncq key of the wrong type", key=key, expected="hash")
        return None
    return parse_progress(reply, key)


def settled(stored: TaskProgress | None, state: TaskState | None) -> TaskProgress | None:
    """*stored* as shown for a task in *state*: a succeeded (completed) task is at 100 %.

    Handlers report before or during each step, so ``progress(i / n)`` in a loop
    last reports (n-1)/n and the return is the last step. The fraction is settled
    where progress is read rather than written as 1.0 when the handler returns: the
    worker writes its last value then, before the acknowledgement decides the
    outcome (a lost lease still retries the task), so 100 % could show for a task
    that runs again, while the completed state is the outcome itself. Reading also
    settles what older asyncq workers stored. The message and time stay the
    handler's last.
    """
    if stored is None or state is not TaskState.COMPLETED or stored.fraction >= 1.0:
        return stored
    return dataclasses.replace(stored, fraction=1.0)


def _update(data: Any) -> TaskProgress | None:
    try:
        raw = json.loads(data)
        return TaskProgress.of(float(raw["fraction"]), str(raw["message"]), float(raw["time"]))
    except (ValueError, KeyError, TypeError):
        return None


async def watch_progress(
    redis: RedisClient,
    queue: str,
    task_id: str,
    *,
    state: Callable[[], Awaitable[TaskState | None]],
    poll_interval: float = 1.0,
) -> AsyncIterator[TaskProgress]:
    """Yield the task's progress as it is reported, until the task is finished.

    The stored value first (if any), then every update published on the
    queue's progress channel. It ends when the task is completed, archived or
    gone (*state* returns None): woken by the completion channel, and checked
    every *poll_interval* for what publishes nothing (a Go worker, a task
    deleted, a lost message).
    """
    if hasattr(redis, "get_nodes"):
        raise NotImplementedError(
            "streaming progress needs Pub/Sub, which Redis Cluster lacks here"
        )
    pubsub: Any = redis.pubsub()
    done = completion_channel(queue)
    try:
        await pubsub.subscribe(progress_channel(queue), done)
        last = await read_progress(redis, queue, task_id)
        if last is not None:
            yield last
        loop = asyncio.get_running_loop()
        check_at = loop.time() + poll_interval
        while True:
            finished = False
            message = await pubsub.get_message(
                ignore_subscribe_messages=True, timeout=poll_interval
            )
            if message is not None and message.get("type") == "message":
                channel = _text(message.get("channel"))
                data = message.get("data")
                if channel == done:
                    finished = _text(data) == task_id
                else:
                    update = _update(data)
                    newer = update is not None and (
                        last is None or update.updated_at >= last.updated_at
                    )
                    if newer and _id_of(data) == task_id:
                        assert update is not None
                        last = update
                        yield update
            if finished or loop.time() >= check_at:
                check_at = loop.time() + poll_interval
                current = await state()
                if current in (None, TaskState.COMPLETED, TaskState.ARCHIVED):
                    final = await read_progress(redis, queue, task_id)
                    if current is TaskState.COMPLETED:
                        # Succeeded. (Without a retention a succeeded task is deleted, which
                        # reads as a deletion: the stream then ends at the last report.)
                        final = settled(final or last, current)
                    if final is not None and (
                        last is None
                        or final.updated_at > last.updated_at
                        or final.fraction > last.fraction
                    ):
                        yield final
                    return
    finally:
        with contextlib.suppress(Exception):
            await pubsub.aclose()


def _id_of(data: Any) -> str | None:
    try:
        return str(json.loads(data)["id"])
    except (ValueError, KeyError, TypeError):
        return None
