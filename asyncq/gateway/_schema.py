"""The gateway's JSON shapes: pydantic v2 models for requests and responses.

Durations are seconds (a number) or a Go/asynq duration string (``"90s"``,
``"1h30m"``, ``"500ms"``); instants are RFC 3339 with a UTC offset, or unix
seconds. Payloads are a JSON value (stored as compact UTF-8 JSON), base64 bytes
or UTF-8 text, chosen by ``payload_encoding``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    Strict,
    WithJsonSchema,
    model_validator,
)

from asyncq import EnqueueOptions, Task, TaskInfo
from asyncq._duration import coerce_duration, whole_seconds
from asyncq._http import json_depth

__all__ = [
    "MAX_JSON_DEPTH",
    "BatchItemResult",
    "BatchRequest",
    "BatchResponse",
    "EnqueueRequest",
    "ErrorBody",
    "ErrorDetail",
    "TaskInfoBody",
    "encode_bytes",
    "load_json",
    "task_info_body",
]

_MAX_INT32 = 2**31 - 1

MAX_JSON_DEPTH = 200
"""Deepest nesting of arrays and objects the gateway reads: a request body (so a payload
nests at most a few levels less) or a stored payload shown as JSON (deeper is shown as
text). Python's parser and pydantic both give up a little further down."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of range (it has no JSON value)")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_json(text: str) -> Any:
    """Strict JSON: no NaN/Infinity (nor numbers that overflow to them), at most
    MAX_JSON_DEPTH levels of nesting. ValueError names what is wrong."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError(f"it nests deeper than {MAX_JSON_DEPTH} levels") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"it nests deeper than {MAX_JSON_DEPTH} levels")
    return value


_DURATION_SCHEMA = {
    "oneOf": [
        {"type": "number", "description": "seconds"},
        {
            "type": "string",
            "description": "a Go duration such as '90s', '1h30m', '500ms' (or ISO 8601 'PT90S')",
        },
    ]
}
_INSTANT_SCHEMA = {
    "oneOf": [
        {"type": "string", "format": "date-time", "description": "RFC 3339 with an offset"},
        {"type": "number", "description": "unix seconds"},
    ]
}

Duration = Annotated[
    timedelta,
    BeforeValidator(coerce_duration),
    WithJsonSchema(_DURATION_SCHEMA),
]


def _instant(value: Any) -> Any:
    """Unix seconds come as a JSON number: a string must be an RFC 3339 time."""
    if isinstance(value, bool):
        raise ValueError("expected an RFC 3339 time or unix seconds, not a boolean")
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return value
        raise ValueError(
            f"expected an RFC 3339 time such as '2030-01-01T00:00:00Z', got the string "
            f"{value!r}: send unix seconds as a number"
        )
    return value


Instant = Annotated[AwareDatetime, BeforeValidator(_instant), WithJsonSchema(_INSTANT_SCHEMA)]
NonBlank = Annotated[str, Field(min_length=1, pattern=r"\S")]
PayloadEncoding = Literal["json", "base64", "text"]


class EnqueueRequest(BaseModel):
    """One task to enqueue, with every asynq enqueue option."""

    model_config = ConfigDict(extra="forbid", title="EnqueueRequest")

    type: NonBlank = Field(description="The task type, e.g. 'email:send'.")
    payload: JsonValue = Field(
        default=None,
        description=(
            "The payload: any JSON value (stored as compact UTF-8 JSON) when payload_encoding "
            "is 'json', a base64 string for 'base64', a string for 'text'. Omitted: empty."
        ),
    )
    payload_encoding: PayloadEncoding = Field(default="json")
    task_id: NonBlank | None = Field(default=None, description="Default: a random UUID4.")
    max_retry: Annotated[int, Strict(), Field(ge=0, le=_MAX_INT32)] | None = Field(
        default=None, description="Retries before the task is archived (default 25)."
    )
    timeout: Duration | None = Field(
        default=None, description="How long one attempt may run (default 30m, whole seconds)."
    )
    deadline: Instant | None = Field(default=None, description="When the task must be done.")
    process_at: Instant | None = Field(default=None, description="When to process it.")
    process_in: Duration | None = Field(default=None, description="Process it after this delay.")
    unique: Duration | None = Field(
        default=None, description="Hold a uniqueness lock on (queue, type, payload) this long."
    )
    retention: Duration | None = Field(
        default=None, description="Keep the completed task (and its result) this long."
    )
    group: NonBlank | None = Field(default=None, description="Aggregation group key.")
    headers: dict[str, str] | None = Field(default=None, description="asynq task headers.")

    @model_validator(mode="after")
    def _check(self) -> EnqueueRequest:
        for name in ("timeout", "process_in", "unique", "retention"):
            value = getattr(self, name)
            if value is not None and value < timedelta(0):
                raise _FieldError(name, f"{name} cannot be negative")
        if self.timeout is not None and self.timeout < timedelta(seconds=1):
            raise _FieldError(
                "timeout",
                "timeout must be at least 1s (asynq stores whole seconds; "
                "omit it for the 30-minute default)",
            )
        if self.unique is not None and self.unique < timedelta(seconds=1):
            raise _FieldError("unique", "unique must be at least 1s")
        if self.process_at is not None and self.process_in is not None:
            raise _FieldError("process_in", "give process_at or process_in, not both")
        self.payload_bytes()  # the encoding errors name the payload field
        return self

    def payload_bytes(self) -> bytes | None:
        """The payload as the bytes to store (None when no payload was given)."""
        if "payload" not in self.model_fields_set:
            return None
        if self.payload_encoding == "json":
            return json.dumps(self.payload, separators=(",", ":"), ensure_ascii=False).encode()
        if not isinstance(self.payload, str):
            raise _FieldError(
                "payload",
                f"payload must be a string when payload_encoding is {self.payload_encoding!r}",
            )
        if self.payload_encoding == "text":
            return self.payload.encode()
        try:
            return base64.b64decode(self.payload, validate=True)
        except (binascii.Error, ValueError):
            raise _FieldError("payload", "payload is not valid base64") from None

    def task(self) -> Task:
        return Task(self.type, self.payload_bytes())

    def options(self, queue: str) -> EnqueueOptions:
        opts: EnqueueOptions = {"queue": queue}
        if self.task_id is not None:
            opts["task_id"] = self.task_id
        if self.max_retry is not None:
            opts["max_retry"] = self.max_retry
        if self.timeout is not None:
            opts["timeout"] = self.timeout
        if self.deadline is not None:
            opts["deadline"] = self.deadline
        if self.process_at is not None:
            opts["process_at"] = self.process_at
        if self.process_in is not None:
            opts["process_in"] = self.process_in
        if self.unique is not None:
            opts["unique"] = self.unique
        if self.retention is not None:
            opts["retention"] = self.retention
        if self.group is not None:
            opts["group"] = self.group
        if self.headers:
            opts["headers"] = self.headers
        return opts


class _FieldError(ValueError):
    """A semantic check failed for one field (pydantic reports it with that field's name)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class BatchRequest(BaseModel):
    """Several tasks for one queue; each is checked and enqueued on its own."""

    model_config = ConfigDict(extra="forbid", title="BatchRequest")

    tasks: Annotated[
        list[Any],
        WithJsonSchema(
            {
                "type": "array",
                "minItems": 1,
                "items": {"$ref": "#/components/schemas/EnqueueRequest"},
            }
        ),
    ] = Field(min_length=1, description="EnqueueRequest objects, each checked on its own.")


class ErrorDetail(BaseModel):
    code: str = Field(
        description=(
            "invalid_request, invalid_json, unsupported_media_type, payload_too_large, "
            "unauthorized, duplicate_task, task_id_conflict, queue_not_found, task_not_found, "
            "not_found, redis_unavailable, internal"
        )
    )
    message: str
    field: str | None = Field(default=None, description="The request field at fault, if one.")


class ErrorBody(BaseModel):
    model_config = ConfigDict(title="Error")

    error: ErrorDetail


class TaskInfoBody(BaseModel):
    """A task as stored in Redis."""

    model_config = ConfigDict(title="TaskInfo")

    id: str
    queue: str
    type: str
    state: Literal[
        "active", "pending", "scheduled", "retry", "archived", "completed", "aggregating"
    ]
    payload: JsonValue
    payload_encoding: PayloadEncoding
    headers: dict[str, str]
    max_retry: int
    retried: int
    last_error: str | None
    last_failed_at: datetime | None
    timeout: int | None = Field(description="seconds")
    deadline: datetime | None
    group: str | None
    next_process_at: datetime | None
    retention: int | None = Field(description="seconds")
    completed_at: datetime | None
    result: JsonValue = Field(description="null when the task has no result")
    result_encoding: PayloadEncoding | None
    is_orphaned: bool


class BatchItemResult(BaseModel):
    status: int = Field(description="The status this item would have had alone: 201, 400 or 409.")
    task: TaskInfoBody | None = None
    error: ErrorDetail | None = None


class BatchResponse(BaseModel):
    model_config = ConfigDict(title="BatchResponse")

    results: list[BatchItemResult]


def encode_bytes(data: bytes) -> tuple[JsonValue, PayloadEncoding]:
    """Stored bytes as a JSON value: parsed JSON, else UTF-8 text, else base64."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), "base64"
    try:
        value: JsonValue = load_json(text)
    except ValueError:  # also NaN/Infinity and too deep: shown as the text it is
        return text, "text"
    return value, "json"


def task_info_body(info: TaskInfo) -> TaskInfoBody:
    payload, payload_encoding = encode_bytes(info.payload)
    result: JsonValue = None
    result_encoding: PayloadEncoding | None = None
    if info.result is not None:
        result, result_encoding = encode_bytes(info.result)
    return TaskInfoBody(
        id=info.id,
        queue=info.queue,
        type=info.type,
        state=info.state.value,
        payload=payload,
        payload_encoding=payload_encoding,
        headers=info.headers,
        max_retry=info.max_retry,
        retried=info.retried,
        last_error=info.last_error or None,
        last_failed_at=info.last_failed_at,
        timeout=None if info.timeout is None else whole_seconds(info.timeout),
        deadline=info.deadline,
        group=info.group or None,
        next_process_at=info.next_process_at,
        retention=None if info.retention is None else whole_seconds(info.retention),
        completed_at=info.completed_at,
        result=result,
        result_encoding=result_encoding,
        is_orphaned=info.is_orphaned,
    )
