"""Composition: a Task and its options turned into asynq's TaskMessage and a write plan.

:func:`compose` is asynq's composeOptions plus message construction and
routing (spec section 1.3), for every option. :class:`Templates` is the
producer's hot path: for the common enqueue, whose options are only
``queue``/``max_retry``/``timeout``/``retention``, everything but the type,
payload, id and headers is the same from call to call, so it is composed once
per option set (through :func:`compose`, so validation and errors are the
same) and each call only builds the message's varying fields in front of a
cached byte tail. Both paths produce the same bytes (tested on random
options).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from asyncq import _keys as keys
from asyncq._broker import BatchItem
from asyncq._codec import encode_task_head, encode_task_headers, encode_task_message
from asyncq._duration import non_negative, whole_seconds
from asyncq._suggest import ENQUEUE_OPTION_ALIASES, suggest
from asyncq._time import require_aware, to_unix
from asyncq.proto.asynq import TaskMessage
from asyncq.task import EnqueueOptions, Task, TaskInfo, TaskState, pending_info

__all__ = [
    "DEFAULT_MAX_RETRY",
    "DEFAULT_QUEUE",
    "DEFAULT_TIMEOUT",
    "Composed",
    "Plain",
    "Template",
    "Templates",
    "check_option_names",
    "compose",
    "info_of",
    "new_task_id",
]

DEFAULT_MAX_RETRY = 25
"""Retries a task gets when ``max_retry`` is not given (asynq's default)."""
DEFAULT_QUEUE = "default"
"""Queue used when ``queue`` is not given."""
DEFAULT_TIMEOUT = timedelta(minutes=30)
"""Timeout stored when neither ``timeout`` nor ``deadline`` is given."""

_MAX_INT32 = 2**31 - 1
_OPTION_NAMES = frozenset(EnqueueOptions.__annotations__)


@dataclass(slots=True)
class Composed:
    """A task message ready for the broker, and where it goes."""

    message: TaskMessage
    state: TaskState
    process_at: datetime  # when it becomes ready; == now for pending/aggregating
    unique_ttl: int | None  # the unique lock's whole TTL in seconds; None: no lock
    group: str | None

    def batch_item(self) -> BatchItem:
        """This task as a :class:`BatchItem`, routed exactly as :meth:`Client.enqueue` routes it."""
        return BatchItem(
            self.message,
            process_at=self.process_at if self.state is TaskState.SCHEDULED else None,
            unique_ttl=self.unique_ttl,
            group=self.group if self.state is TaskState.AGGREGATING else None,
        )


_ID_POOL: list[str] = []
_ID_BATCH = 256
_ID_SIZE = 36  # 32 hex digits and 4 dashes: 8-4-4-4-12
_HIGH = bytes(b"0123456789abcdef"[b >> 4] for b in range(256))
_LOW = bytes(b"0123456789abcdef"[b & 15] for b in range(256))
# Byte 8's high digit with the RFC 4122 variant bits (10xx: 8, 9, a or b), as uuid4 sets it.
_VARIANT = bytes(b"89ab"[(b >> 4) & 3] for b in range(256))
_DIGIT_AT = [k + (k >= 8) + (k >= 12) + (k >= 16) + (k >= 20) for k in range(32)]
_DASHES = b"-" * _ID_BATCH
_VERSION = b"4" * _ID_BATCH


def _refill_ids() -> None:
    # str(uuid.UUID(bytes=16 random bytes, version=4)) for each id, made with C-level
    # translations and slice assignments over the whole batch: per id, only its slice
    # is built in Python (a third of the time of formatting each id).
    raw = os.urandom(16 * _ID_BATCH)
    high, low = raw.translate(_HIGH), raw.translate(_LOW)
    text = bytearray(_ID_SIZE * _ID_BATCH)
    for j in range(16):
        text[_DIGIT_AT[2 * j] :: _ID_SIZE] = high[j::16]
        text[_DIGIT_AT[2 * j + 1] :: _ID_SIZE] = low[j::16]
    text[_DIGIT_AT[12] :: _ID_SIZE] = _VERSION
    text[_DIGIT_AT[16] :: _ID_SIZE] = raw[8::16].translate(_VARIANT)
    text[8::_ID_SIZE] = text[13::_ID_SIZE] = text[18::_ID_SIZE] = text[23::_ID_SIZE] = _DASHES
    ids = text.decode()
    _ID_POOL.extend([ids[i : i + _ID_SIZE] for i in range(0, _ID_SIZE * _ID_BATCH, _ID_SIZE)])


# A forked child must not hand out the ids its parent holds too.
os.register_at_fork(after_in_child=_ID_POOL.clear)


def new_task_id() -> str:
    """A random UUID4 in its canonical text form (what ``str(uuid.uuid4())`` gives).

    Made 256 at a time from one read of the OS's random source (list.pop is
    atomic, so threads never share one).
    """
    try:
        return _ID_POOL.pop()
    except IndexError:
        _refill_ids()
        return _ID_POOL.pop()


def check_option_names(options: Mapping[str, object], where: str) -> None:
    if options.keys() <= _OPTION_NAMES:
        return
    unknown = sorted(set(options) - _OPTION_NAMES)
    if unknown:
        hints = [
            f"{name!r}: did you mean {near!r}?"
            for name in unknown
            if (near := suggest(name, _OPTION_NAMES, ENQUEUE_OPTION_ALIASES))
        ]
        raise TypeError(
            f"unknown enqueue option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"in {where}{' (' + '; '.join(hints) + ')' if hints else ''} "
            f"(known: {', '.join(sorted(_OPTION_NAMES))})"
        )


def _merge(levels: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """Later levels win, key by key; None means "not set" at that level.

    ``process_at`` and ``process_in`` are one setting: a level that gives
    either replaces both from earlier levels, and giving both in one level is
    an error (asynq silently lets the later one win).
    """
    merged: dict[str, object] = {}
    for level in levels:
        if not level:
            continue
        given = {k: v for k, v in level.items() if v is not None and k != "headers"}
        if "process_at" in given and "process_in" in given:
            raise ValueError("give process_at or process_in, not both")
        if "process_at" in given or "process_in" in given:
            merged.pop("process_at", None)
            merged.pop("process_in", None)
        merged.update(given)
    return merged


def _merge_headers(task: Task, levels: Sequence[Mapping[str, object]]) -> dict[str, str]:
    headers = dict(task.headers)
    for level in levels:
        if not level:
            continue
        extra = level.get("headers")
        if extra is None:
            continue
        if not isinstance(extra, Mapping):
            raise TypeError(f"headers must be a mapping of str to str, got {type(extra).__name__}")
        headers.update(extra)
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"header keys and values must be str, got {type(key).__name__}: "
                f"{type(value).__name__} for {key!r}"
            )
    return headers


def _non_blank(opts: Mapping[str, object], name: str, message: str) -> str | None:
    value = opts.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(message)
    return value


def _instant(opts: Mapping[str, object], name: str) -> datetime | None:
    value = opts.get(name)
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime.datetime, got {type(value).__name__}")
    return require_aware(value, name)


def require_typename(value: object) -> str:
    """*value* as a task's type: a string with a character that is not blank. Task() checks
    its argument the same way, but ``Task.type`` can be set afterwards, so every path from
    a Task to a message checks again."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("task typename cannot be empty")
    return value


def compose(task: Task, levels: Sequence[Mapping[str, object]], now: datetime) -> Composed:
    """asynq's composeOptions + message construction + routing decision (spec section 1.3)."""
    if not isinstance(task, Task):
        raise TypeError(f"expected an asyncq Task, got {type(task).__name__}")
    require_typename(task.type)
    levels = [task.options, *levels]
    for i, level in enumerate(levels):
        check_option_names(level, "the task's options" if i == 0 else "the enqueue options")
    opts = _merge(levels)
    headers = _merge_headers(task, levels)

    queue = _non_blank(opts, "queue", "queue name must contain one or more characters")
    queue = DEFAULT_QUEUE if queue is None else queue
    task_id = _non_blank(opts, "task_id", "task ID cannot be empty")
    task_id = new_task_id() if task_id is None else task_id
    group = _non_blank(opts, "group", "group key cannot be empty")
    keys.validate_queue_name(queue)
    keys.refuse_braces("task ID", task_id)
    if group is not None:
        keys.refuse_braces("group", group)

    max_retry = opts.get("max_retry", DEFAULT_MAX_RETRY)
    if isinstance(max_retry, bool) or not isinstance(max_retry, int):
        raise TypeError(f"max_retry must be an int, got {type(max_retry).__name__}")
    if max_retry < 0:
        # asynq clamps a negative MaxRetry to 0; a negative count is a bug, so say so.
        raise ValueError(f"max_retry cannot be negative, got {max_retry}")
    if max_retry > _MAX_INT32:
        raise ValueError(f"max_retry must fit in 32 bits, got {max_retry}")

    timeout = non_negative(opts.get("timeout"), "timeout")
    if timeout is not None and timedelta(0) < timeout < timedelta(seconds=1):
        # Stored as whole seconds: a sub-second timeout would become 0 = "no timeout".
        raise ValueError(f"timeout must be at least 1s (asynq stores whole seconds), got {timeout}")
    deadline = _instant(opts, "deadline")
    if not timeout and deadline is None:
        timeout = DEFAULT_TIMEOUT

    unique = non_negative(opts.get("unique"), "unique")
    if unique is not None and unique < timedelta(seconds=1):
        raise ValueError("Unique TTL cannot be less than 1s")
    retention = non_negative(opts.get("retention"), "retention")

    process_at = _instant(opts, "process_at")
    process_in = non_negative(opts.get("process_in"), "process_in")
    if process_in is not None:
        try:
            process_at = now + process_in
        except OverflowError:
            raise ValueError(f"process_in is too far in the future: {process_in!r}") from None
    if process_at is None:
        process_at = now

    message = TaskMessage(
        type=task.type,
        payload=b"" if task.payload is None else task.payload,
        headers=headers,
        id=task_id,
        queue=queue,
        retry=max_retry,
        timeout=whole_seconds(timeout) if timeout else 0,
        deadline=to_unix(deadline) if deadline is not None else 0,
        unique_key=keys.unique_key(queue, task.type, task.payload) if unique else "",
        group_key=group or "",
        retention=whole_seconds(retention) if retention else 0,
    )
    if process_at > now:
        state = TaskState.SCHEDULED  # scheduling wins over grouping, as in asynq
    elif group is not None:
        state = TaskState.AGGREGATING
    else:
        state = TaskState.PENDING
    unique_ttl = None
    if unique is not None:
        # A scheduled task's lock lasts until it is due plus the uniqueness period (asynq).
        try:
            lock = process_at - now + unique if state is TaskState.SCHEDULED else unique
        except OverflowError:
            raise ValueError(
                f"unique is too long for process_at {process_at}: {unique!r}"
            ) from None
        unique_ttl = whole_seconds(lock)
    return Composed(message, state, process_at.astimezone(UTC), unique_ttl, group)


def info_of(c: Composed, now: datetime) -> TaskInfo:
    next_process_at = {
        TaskState.PENDING: now,
        TaskState.SCHEDULED: c.process_at,
        TaskState.AGGREGATING: None,
    }[c.state]
    return TaskInfo.from_message(c.message, c.state, next_process_at)


# -- the hot path: templates for plain option sets ------------------------------------------

_TEMPLATE_OPTIONS = frozenset(("queue", "max_retry", "timeout", "retention"))
_TEMPLATE_CACHE_LIMIT = 256


@dataclass(frozen=True, slots=True)
class Template:
    """A pending task's composition for one plain option set, minus type, payload, id, headers."""

    queue: str
    max_retry: int
    timeout: timedelta | None
    retention: timedelta | None
    tail: bytes  # fields 4-14 of the message, encoded

    @classmethod
    def of(cls, message: TaskMessage) -> Template:
        """The template of *message*: a plain pending task's message, as :func:`compose` made it."""
        tail = encode_task_message(
            TaskMessage(
                queue=message.queue,
                retry=message.retry,
                timeout=message.timeout,
                retention=message.retention,
            )
        )
        return cls(
            message.queue,
            message.retry,
            timedelta(seconds=message.timeout) if message.timeout else None,
            timedelta(seconds=message.retention) if message.retention else None,
            tail,
        )

    def encode(self, task: Task) -> Plain:
        """*task* with this option set, ready to write: a new id and its message bytes.

        Raises as :func:`compose` does for a blank type or non-str headers.
        """
        task_type = task.type
        try:
            type_field = _TYPE_FIELDS[task_type]
        except (KeyError, TypeError):
            type_field = _learn_type_field(task_type)
        payload = task.payload or b""
        headers = _merge_headers(task, ()) if task.headers else {}
        task_id = new_task_id()
        # exactly what encoding compose's message gives: its head, the tail, its headers
        ib = task_id.encode()
        if 0 < len(payload) < 0x80 and len(ib) < 0x80:  # one byte each length: the usual task
            # encode_task_head's bytes with the type field kept
            data = _PLAIN_MESSAGE % (type_field, len(payload), payload, len(ib), ib, self.tail)
        else:
            data = encode_task_head(task_type, payload, task_id) + self.tail
        if headers:
            data += encode_task_headers(headers)
        return _new_plain(Plain, (self, task_type, payload, task_id, headers, data))

    def message(
        self, task: Task, task_id: str, headers: dict[str, str]
    ) -> tuple[TaskMessage, bytes]:
        """*task*'s message with this option set, *task_id* and *headers* over its own,
        and its encoding: what :func:`compose` gives with those as the call's options,
        and :func:`~asyncq._codec.encode_task_message` of it (a durable run's step)."""
        require_typename(task.type)
        keys.refuse_braces("task ID", task_id)
        merged = _merge_headers(task, ({"headers": headers},)) if task.headers else headers
        payload = b"" if task.payload is None else task.payload
        message = TaskMessage(
            type=task.type,
            payload=payload,
            headers=merged,
            id=task_id,
            queue=self.queue,
            retry=self.max_retry,
            timeout=whole_seconds(self.timeout) if self.timeout else 0,
            retention=whole_seconds(self.retention) if self.retention else 0,
        )
        data = encode_task_head(task.type, payload, task_id) + self.tail
        return message, data + encode_task_headers(merged) if merged else data


# Field 1 of the messages of each task type encoded on the hot path, by type (checked
# before it is kept): a producer has few types, and its own bound keeps a hostile one small.
_TYPE_FIELDS: dict[str, bytes] = {}
_TYPE_FIELDS_LIMIT = 1024
# A plain message whose payload and id have 1-127 bytes: the type field, fields 2 and 3,
# then the template's tail.
_PLAIN_MESSAGE = b"%b\x12%c%b\x1a%c%b%b"


def _learn_type_field(task_type: object) -> bytes:
    """*task_type*'s field 1, encoded as :func:`encode_task_head` writes it, and kept."""
    name = require_typename(task_type)
    field = encode_task_head(name, b"", "")
    if len(_TYPE_FIELDS) >= _TYPE_FIELDS_LIMIT:
        _TYPE_FIELDS.clear()
    _TYPE_FIELDS[name] = field
    return field


class Plain(NamedTuple):
    """A task composed on the hot path: its template, fields and encoded message."""

    template: Template
    task_type: str
    payload: bytes
    task_id: str
    headers: dict[str, str]
    data: bytes

    def info(self, now: datetime) -> TaskInfo:
        """Its TaskInfo once written at *now*: what :func:`info_of` gives for the same task."""
        t = self.template
        return pending_info(
            self.task_id,
            self.task_type,
            self.payload,
            self.headers,
            now,
            t.queue,
            t.max_retry,
            t.timeout,
            t.retention,
        )


# What Plain(...) does (NamedTuple's generated __new__), without its Python frame.
_new_plain = tuple.__new__


def _cache_key(options: Mapping[str, object]) -> object | None:
    if not options:
        return ()
    if len(options) == 1:
        queue = options.get("queue")
        if queue.__class__ is str:
            return queue  # the usual set, by the name alone (no tuple to build and hash)
    if not _TEMPLATE_OPTIONS.issuperset(options):
        return None
    # The classes too: True == 1 and 1.0 == 1 hash alike, but compose refuses them.
    return (*options.items(), *map(type, options.values()))


class Templates:
    """Templates by option set, learned from :func:`compose` on the first enqueue of each set."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[object, Template] = {}

    @staticmethod
    def call_key(options: Mapping[str, object]) -> object | None:
        """The cache key part of call options (None: they need the general path)."""
        return _cache_key(options)

    @staticmethod
    def key(task: Task, call_key: object | None) -> object | None:
        """The cache key of *task* enqueued with options of *call_key*; None: general path."""
        if call_key is None:
            return None
        own = _cache_key(task.options)
        if own is None:
            return None
        return (own, call_key)

    def find(self, task: Task, options: Mapping[str, object]) -> Template | None:
        """The template for *task* enqueued with call *options*, when one was learned:
        ``get(key(task, call_key(options)))`` in one call (the Client's hot path)."""
        call = _cache_key(options) if options else ()
        if call is None:
            return None
        own = task.options
        own_key = _cache_key(own) if own else ()
        if own_key is None:
            return None
        try:
            return self._cache.get((own_key, call))
        except TypeError:  # an unhashable option value: compose will name it
            return None

    def get(self, key: object) -> Template | None:
        try:
            return self._cache.get(key)
        except TypeError:  # an unhashable option value: compose will name it
            return None

    def learn(self, key: object, composed: Composed) -> None:
        """Remember *composed*'s template for *key* (it came from compose with that option set)."""
        if composed.state is not TaskState.PENDING:
            return
        try:
            hash(key)
        except TypeError:
            return
        if len(self._cache) >= _TEMPLATE_CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = Template.of(composed.message)
