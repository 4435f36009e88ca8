"""Tasks, task states and the TaskInfo snapshot returned by the client and inspector."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast

from typing_extensions import Unpack

from asyncq._duration import from_stored_seconds
from asyncq._time import from_unix, utc_from_timestamp
from asyncq.proto.asynq import TaskMessage

__all__ = [
    "EnqueueOptions",
    "ResultWriter",
    "Task",
    "TaskInfo",
    "TaskOptions",
    "TaskProgress",
    "TaskState",
]


class TaskState(enum.StrEnum):
    """A task's state; the values are the strings stored in the task hash ``state`` field."""

    ACTIVE = "active"
    PENDING = "pending"
    SCHEDULED = "scheduled"
    RETRY = "retry"
    ARCHIVED = "archived"
    COMPLETED = "completed"
    AGGREGATING = "aggregating"


class TaskOptions(TypedDict, total=False):
    """Enqueue options a :class:`Task` can carry as defaults (call options override them).

    Datetimes must be timezone-aware; naive ones are rejected with ValueError.
    """

    queue: str
    max_retry: int
    timeout: timedelta | None
    deadline: datetime | None
    unique: timedelta | None
    process_at: datetime | None
    process_in: timedelta | None
    task_id: str | None
    retention: timedelta | None
    group: str | None


class EnqueueOptions(TaskOptions, total=False):
    """Options accepted by ``Client.enqueue``: the task options plus extra ``headers``."""

    headers: Mapping[str, str] | None


class ResultWriter(Protocol):
    """Writes a handler's result into the task hash (``result`` field)."""

    @property
    def task_id(self) -> str: ...

    async def write(self, data: bytes) -> int:
        """Store *data* as the task's result; returns the number of bytes written."""
        ...


class Task:
    """A unit of work: a type name, an opaque payload, headers and default options.

    Inside a handler the same object also carries the running task's identity
    (``id``, ``queue``, ``retry_count``, ``max_retry``, ``deadline``) and a
    ``result_writer``.
    """

    __slots__ = (
        "_deadline",
        "_deadline_ts",
        "_message",
        "headers",
        "id",
        "max_retry",
        "options",
        "payload",
        "queue",
        "result_writer",
        "retry_count",
        "type",
    )

    def __init__(
        self,
        type: str,
        payload: bytes | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        **options: Unpack[TaskOptions],
    ) -> None:
        if not isinstance(type, str) or not type.strip():
            raise ValueError("task typename cannot be empty")
        # The usual payload, bytes, is taken as it is (immutable) without the isinstance
        # check against a union, which is slower than the rest of this method: a Task is
        # built per enqueue.
        if payload is not None and payload.__class__ is not bytes:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise TypeError(
                    f"task payload must be bytes or None, got {payload.__class__.__name__}; "
                    "use Task.from_json() for JSON data"
                )
            payload = bytes(payload)
        self.type = type
        self.payload: bytes | None = payload
        self.headers: dict[str, str] = dict(headers) if headers else {}
        self.options: TaskOptions = options
        self.id: str | None = None
        self.queue: str | None = None
        self.retry_count: int = 0
        self.max_retry: int | None = None
        self._deadline: datetime | None = None
        self._deadline_ts: float | None = None
        self.result_writer: ResultWriter | None = None
        self._message: TaskMessage | None = None

    @classmethod
    def from_json(
        cls,
        type: str,
        data: Any,
        *,
        headers: Mapping[str, str] | None = None,
        **options: Unpack[TaskOptions],
    ) -> Task:
        """A task whose payload is *data* encoded as compact UTF-8 JSON."""
        payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        return cls(type, payload, headers=headers, **options)

    @property
    def deadline(self) -> datetime | None:
        """When the running attempt is cancelled (timeout or deadline); None outside a handler."""
        # Built on first use: most handlers never look, and a datetime per task is not free.
        if self._deadline is None and self._deadline_ts is not None:
            self._deadline = utc_from_timestamp(self._deadline_ts)
        return self._deadline

    @deadline.setter
    def deadline(self, value: datetime | None) -> None:
        self._deadline = value
        self._deadline_ts = None

    def _deadline_moved(self, ts: float) -> None:
        """The running attempt's deadline is now *ts* (unix seconds), unless the handler set
        its own (internal: the worker's, when an inline step moves the attempt's)."""
        if self._deadline_ts is not None:
            self._deadline_ts, self._deadline = ts, None

    def json(self) -> Any:
        """Decode the payload as JSON (raises ValueError when it is not JSON)."""
        if self.payload is None:
            raise ValueError(f"task {self.type!r} has no payload to decode as JSON")
        return json.loads(self.payload)

    @classmethod
    def _from_message(cls, msg: TaskMessage) -> Task:
        """The handler-side Task for a dequeued message (internal)."""
        task = cls.__new__(cls)
        task.type = msg.type
        task.payload = msg.payload
        task.headers = dict(msg.headers)
        task.options = {}
        task.id = msg.id
        task.queue = msg.queue
        task.retry_count = msg.retried
        task.max_retry = msg.retry
        task._deadline = None
        task._deadline_ts = None
        task.result_writer = None
        task._message = msg
        return task

    def __repr__(self) -> str:
        ident = f" id={self.id!r}" if self.id else ""
        return f"<Task type={self.type!r}{ident}>"


@dataclass(frozen=True, slots=True)
class TaskProgress:
    """How far a running task is, as its handler last reported (``asyncq.progress``)."""

    fraction: float
    """Between 0 and 1."""
    message: str
    updated_at: datetime

    @classmethod
    def of(cls, fraction: float, message: str, unix: float) -> TaskProgress:
        return cls(fraction, message, datetime.fromtimestamp(unix, UTC))

    @property
    def percent(self) -> int:
        """The fraction as a whole percentage (rounded down)."""
        return int(self.fraction * 100)


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A snapshot of a task as stored in Redis (asynq's TaskInfo)."""

    id: str
    queue: str
    type: str
    payload: bytes
    state: TaskState
    max_retry: int
    retried: int
    last_error: str
    last_failed_at: datetime | None
    timeout: timedelta | None
    deadline: datetime | None
    group: str
    next_process_at: datetime | None
    retention: timedelta | None
    completed_at: datetime | None
    result: bytes | None
    headers: dict[str, str] = field(default_factory=dict)
    is_orphaned: bool = False
    progress: TaskProgress | None = None
    """The handler's last reported progress (asyncq-only; read by the Inspector)."""

    @classmethod
    def from_message(
        cls,
        msg: TaskMessage,
        state: TaskState,
        next_process_at: datetime | None,
        result: bytes | None = None,
        *,
        is_orphaned: bool = False,
    ) -> TaskInfo:
        """Build from a stored TaskMessage; asynq's 0 values become None.

        Any int64 is accepted: durations beyond timedelta's range become
        ``timedelta.max``/``min`` and unix times beyond datetime's range
        ``datetime.max``/``min`` (in UTC), so extreme values another writer
        stored can always be read.
        """
        return cls(
            id=msg.id,
            queue=msg.queue,
            type=msg.type,
            payload=msg.payload,
            state=state,
            max_retry=msg.retry,
            retried=msg.retried,
            last_error=msg.error_msg,
            last_failed_at=from_unix(msg.last_failed_at),
            timeout=from_stored_seconds(msg.timeout),
            deadline=from_unix(msg.deadline),
            group=msg.group_key,
            next_process_at=next_process_at,
            retention=from_stored_seconds(msg.retention),
            completed_at=from_unix(msg.completed_at),
            result=result,
            headers=dict(msg.headers),
            is_orphaned=is_orphaned,
        )

    def json(self) -> Any:
        """Decode the payload as JSON."""
        return json.loads(self.payload)


class _PendingInfo:
    """The TaskInfo of a pending task just written (the client returns one per enqueue).

    The frozen dataclass's __init__ sets each of its 19 fields through
    object.__setattr__ (a call with an argument tuple per field): a quarter of a
    client's Python work per enqueue. This class has the same slots in the same order,
    so the same memory layout: its __init__ fills them with plain stores from the nine
    values that vary, then makes the object a TaskInfo, frozen from there on. Calling it
    gives what ``TaskInfo(...)`` gives for the same task in half the time.
    """

    __slots__ = tuple(f.name for f in fields(TaskInfo))

    def __init__(  # noqa: PLR0917 - called once per enqueue: keywords cost more per call
        self,
        task_id: str,
        task_type: str,
        payload: bytes,
        headers: dict[str, str],
        now: datetime,
        queue: str,
        max_retry: int,
        timeout: timedelta | None,
        retention: timedelta | None,
    ) -> None:
        self.id = task_id
        self.queue = queue
        self.type = task_type
        self.payload = payload
        self.state = TaskState.PENDING
        self.max_retry = max_retry
        self.retried = 0
        self.last_error = ""
        self.last_failed_at = None
        self.timeout = timeout
        self.deadline = None
        self.group = ""
        self.next_process_at = now
        self.retention = retention
        self.completed_at = None
        self.result = None
        self.headers = headers
        self.is_orphaned = False
        self.progress = None
        self.__class__ = TaskInfo  # type: ignore[assignment]  # same layout: checked below


# ``TaskInfo(...)`` of a pending task just written at *now*, with no deadline or group:
# the class itself, so that a call is one frame.
pending_info = cast(
    "Callable[[str, str, bytes, dict[str, str], datetime, str, int, timedelta | None, timedelta | None], TaskInfo]",  # noqa: E501
    _PendingInfo,
)


# The layouts match, or the class switch raises here, at import.
_PendingInfo("", "", b"", {}, datetime.min, "", 0, None, None)


if TYPE_CHECKING:  # keep the Protocol honest for mypy
    _rw: ResultWriter
