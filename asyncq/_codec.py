"""A fast hand-written protobuf codec for TaskMessage, the message on asyncq's hot path,
and an encoder for the messages a worker and a scheduler write about themselves.

Every dequeued task is decoded and every retry/archive/completion re-encodes
one, so the generic betterproto2 reflection path (~30 us to decode, ~40 us to
encode on our machines) would dominate a no-op task's cost. This module
speaks the same proto3 wire format for ``asynq.TaskMessage`` only: fields in
number order, zero values omitted, map entries with key then value, and any
unknown field (a newer asynq's addition) kept verbatim and re-emitted, so a
round trip never loses data. The generated class stays the source of truth:
the tests check this codec against betterproto2 on random messages.

:func:`encode_record` writes ServerInfo, WorkerInfo, SchedulerEntry and
SchedulerEnqueueEvent, laid out from the generated classes' own field metadata.
betterproto2's ``bytes(message)`` first asks whether the message is a pydantic
dataclass, and that question imports ``pydantic.dataclasses``: 30-50 ms of a
worker's start-up CPU at its first heartbeat, several times what the rest of the
start-up costs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import betterproto2

from asyncq.proto.asynq import (
    SchedulerEnqueueEvent,
    SchedulerEntry,
    ServerInfo,
    TaskMessage,
    WorkerInfo,
)
from asyncq.proto.google.protobuf import Timestamp

__all__ = [
    "decode_task_message",
    "encode_record",
    "encode_task_head",
    "encode_task_headers",
    "encode_task_message",
]

_STR_FIELDS = {1: "type", 3: "id", 4: "queue", 7: "error_msg", 10: "unique_key", 14: "group_key"}
_INT_FIELDS = {
    5: "retry",
    6: "retried",
    8: "timeout",
    9: "deadline",
    11: "last_failed_at",
    12: "retention",
    13: "completed_at",
}
_INT32_FIELDS = frozenset({5, 6})
# The same fields indexed by a field's first byte, its tag (field number << 3 | wire
# type) when the number is below 16: the decoder's dispatch is one list index per field.
# A known field number with another wire type matches neither table and is kept as an
# unknown field, as proto3 parsers keep it; so is a byte starting a longer tag.
_PAYLOAD_TAG = 2 << 3 | 2
_HEADER_TAG = 15 << 3 | 2
_LEN_NAMES = {number << 3 | 2: name for number, name in _STR_FIELDS.items()}
_LEN_NAMES |= {_PAYLOAD_TAG: "payload", _HEADER_TAG: "headers"}
_LEN_TAGS = [_LEN_NAMES.get(tag) for tag in range(256)]
_INT_NAMES = {number << 3: (number, name) for number, name in _INT_FIELDS.items()}
_INT_TAGS = [_INT_NAMES.get(tag) for tag in range(256)]
# A decoded message's attributes before its fields are read: those of an empty
# TaskMessage, so the generated class stays the source of truth for names and defaults.
_EMPTY = dict(vars(TaskMessage()))
_new_message = object.__new__
_MASK64 = (1 << 64) - 1


def _varint(value: int) -> bytes:
    value &= _MASK64  # negative ints are sign-extended to 10 bytes, as proto requires
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        try:
            b = buf[pos]
        except IndexError:
            raise ValueError("truncated varint in TaskMessage") from None
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes in TaskMessage")


def _skip(buf: bytes, pos: int, wire_type: int) -> int:
    if wire_type == 0:
        return _read_varint(buf, pos)[1]
    if wire_type == 1:
        return pos + 8
    if wire_type == 2:
        length, pos = _read_varint(buf, pos)
        return pos + length
    if wire_type == 5:
        return pos + 4
    raise ValueError(f"unsupported protobuf wire type {wire_type} in TaskMessage")


def _signed(value: int, field: int) -> int:
    if field in _INT32_FIELDS:
        value &= 0xFFFFFFFF
        return value - (1 << 32) if value >= 1 << 31 else value
    return value - (1 << 64) if value >= 1 << 63 else value


def _decode_map_entry(buf: bytes) -> tuple[str, str]:
    end = len(buf)
    if end >= 4 and buf[0] == 0x0A:  # the usual entry: key then value, one-byte lengths
        klen = buf[1]
        if klen < 0x80 and klen + 4 <= end and buf[klen + 2] == 0x12:
            vlen = buf[klen + 3]
            if vlen < 0x80 and klen + 4 + vlen == end:
                return buf[2 : klen + 2].decode(), buf[klen + 4 :].decode()
    key = value = ""
    pos = 0
    while pos < end:
        tag, pos = _read_varint(buf, pos)
        wire_type = tag & 7
        if wire_type == 2:
            length, pos = _read_varint(buf, pos)
            data = buf[pos : pos + length]
            if len(data) != length:
                raise ValueError("truncated header entry in TaskMessage")
            pos += length
            if tag >> 3 == 1:
                key = data.decode()
            elif tag >> 3 == 2:
                value = data.decode()
        else:
            pos = _skip(buf, pos, wire_type)
    return key, value


def decode_task_message(data: bytes) -> TaskMessage:
    """Decode ``asynq.TaskMessage`` bytes; raises ValueError on malformed input."""
    # The message's attributes are filled in as a dict and given to an instance made
    # without __init__: the generated dataclass __init__ and its default factories cost
    # more than the decoding itself on a small message.
    fields = _EMPTY.copy()
    headers: dict[str, str] = {}
    fields["headers"] = headers
    unknown = b""
    len_tags = _LEN_TAGS
    int_tags = _INT_TAGS
    pos = 0
    end = len(data)
    try:
        while pos < end:
            # Tags, lengths and most ints are one byte: read those inline (the hot path).
            tag = data[pos]
            name = len_tags[tag]
            if name is not None:
                length = data[pos + 1]
                if length < 0x80:
                    pos += 2
                else:
                    length, pos = _read_varint(data, pos + 1)
                stop = pos + length
                if stop > end:
                    raise ValueError("truncated field in TaskMessage")
                if tag == _PAYLOAD_TAG:
                    fields[name] = data[pos:stop]
                elif tag == _HEADER_TAG:
                    hkey, hvalue = _decode_map_entry(data[pos:stop])
                    headers[hkey] = hvalue
                else:
                    fields[name] = data[pos:stop].decode()
                pos = stop
                continue
            known = int_tags[tag]
            if known is not None:
                value = data[pos + 1]
                if value < 0x80:
                    pos += 2
                    fields[known[1]] = value  # small and non-negative as it stands
                elif data[pos + 2] < 0x80:  # two bytes (asynq's default timeout, 1800)
                    fields[known[1]] = (value & 0x7F) | data[pos + 2] << 7
                    pos += 3
                else:
                    value, pos = _read_varint(data, pos + 1)
                    fields[known[1]] = _signed(value, known[0])
                continue
            start = pos
            if tag >= 0x80:
                tag, pos = _read_varint(data, pos)
            else:
                pos += 1
            if tag >> 3 == 0:
                raise ValueError("invalid field number 0 in TaskMessage")
            pos = _skip(data, pos, tag & 7)
            if pos > end:
                raise ValueError("truncated unknown field in TaskMessage")
            unknown += data[start:pos]
    except IndexError:  # a one-byte read past the end
        raise ValueError("truncated varint in TaskMessage") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"invalid UTF-8 in TaskMessage string field: {exc}") from None
    if unknown:
        fields["_unknown_fields"] = unknown
    msg: TaskMessage = _new_message(TaskMessage)
    msg.__dict__ = fields
    return msg


def _len_field(tag: int, raw: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(raw)) + raw


def encode_task_message(msg: TaskMessage) -> bytes:
    """Encode a TaskMessage exactly as proto3 does (zero values omitted, field order)."""
    parts: list[bytes] = []
    append = parts.append
    if msg.type:
        append(_len_field(0x0A, msg.type.encode()))
    if msg.payload:
        append(_len_field(0x12, bytes(msg.payload)))
    if msg.id:
        append(_len_field(0x1A, msg.id.encode()))
    if msg.queue:
        append(_len_field(0x22, msg.queue.encode()))
    if msg.retry:
        append(b"\x28" + _varint(msg.retry))
    if msg.retried:
        append(b"\x30" + _varint(msg.retried))
    if msg.error_msg:
        append(_len_field(0x3A, msg.error_msg.encode()))
    if msg.timeout:
        append(b"\x40" + _varint(msg.timeout))
    if msg.deadline:
        append(b"\x48" + _varint(msg.deadline))
    if msg.unique_key:
        append(_len_field(0x52, msg.unique_key.encode()))
    if msg.last_failed_at:
        append(b"\x58" + _varint(msg.last_failed_at))
    if msg.retention:
        append(b"\x60" + _varint(msg.retention))
    if msg.completed_at:
        append(b"\x68" + _varint(msg.completed_at))
    if msg.group_key:
        append(_len_field(0x72, msg.group_key.encode()))
    if msg.headers:
        append(encode_task_headers(msg.headers))
    unknown = getattr(msg, "_unknown_fields", b"")
    if unknown:
        append(bytes(unknown))
    return b"".join(parts)


def encode_task_head(task_type: str, payload: bytes, task_id: str) -> bytes:
    """Fields 1-3 (type, payload, id) as :func:`encode_task_message` writes them.

    A message is its head, then fields 4-14, then its headers, so a producer
    that keeps fields 4-14 fixed encodes them once and joins the parts.
    """
    tb = task_type.encode()
    ib = task_id.encode()
    n, m = len(tb), len(ib)
    p = len(payload)
    if 0 < n < 0x80 and 0 < p < 0x80 and 0 < m < 0x80:  # the usual task: one formatting
        return b"\x0a%c%b\x12%c%b\x1a%c%b" % (n, tb, p, payload, m, ib)
    head = (b"\x0a" + (bytes((n,)) if n < 0x80 else _varint(n)) + tb) if n else b""
    if p:
        head += b"\x12" + (bytes((p,)) if p < 0x80 else _varint(p)) + payload
    if m:
        head += b"\x1a" + (bytes((m,)) if m < 0x80 else _varint(m)) + ib
    return head


def encode_task_headers(headers: Mapping[str, str]) -> bytes:
    """Field 15 (the headers map) as :func:`encode_task_message` writes it."""
    parts = []
    for key, value in headers.items():
        # Map entries always carry both key and value, as protobuf-go writes them.
        kb, vb = key.encode(), value.encode()
        size = len(kb) + len(vb) + 4
        if size < 0x80:  # every length one byte: the usual header, written inline
            parts.append(bytes((0x7A, size, 0x0A, len(kb))) + kb + bytes((0x12, len(vb))) + vb)
        else:
            parts.append(_len_field(0x7A, _len_field(0x0A, kb) + _len_field(0x12, vb)))
    return b"".join(parts)


# -- records: what servers and schedulers write about themselves -------------------------

_Field = Callable[[Any], bytes]  # a field's value -> its bytes (b"" when not written)


def _timestamp(value: datetime) -> bytes:
    """A google.protobuf.Timestamp's body, converted as betterproto2 converts a datetime."""
    ts = Timestamp.from_datetime(value)  # ValueError for a naive datetime
    return (b"\x08" + _varint(ts.seconds) if ts.seconds else b"") + (
        b"\x10" + _varint(ts.nanos) if ts.nanos else b""
    )


def _field_writer(cls: type, meta: Any) -> _Field:
    """How one field of *cls* is written, by its proto type; zero values are omitted."""
    number, kind = meta.number, meta.proto_type
    varint_tag, len_tag = _varint(number << 3), _varint(number << 3 | 2)

    def text(value: str) -> bytes:
        return len_tag + _len(value.encode()) if value else b""

    def raw(value: bytes) -> bytes:
        return len_tag + _len(bytes(value)) if value else b""

    def integer(value: int) -> bytes:
        return varint_tag + _varint(value) if value else b""

    def texts(values: list[str]) -> bytes:
        return b"".join(len_tag + _len(v.encode()) for v in values)

    def priorities(values: Mapping[str, int]) -> bytes:
        # map entries carry both key and value, as protobuf-go writes them
        return b"".join(
            len_tag + _len(b"\x0a" + _len(k.encode()) + b"\x10" + _varint(v))
            for k, v in values.items()
        )

    def timestamp(value: datetime | None) -> bytes:
        return b"" if value is None else len_tag + _len(_timestamp(value))

    unwrapped = meta.unwrap() if meta.unwrap is not None else None
    if meta.repeated:
        if kind == betterproto2.TYPE_STRING:
            return texts
    elif kind == betterproto2.TYPE_STRING:
        return text
    elif kind == betterproto2.TYPE_BYTES:
        return raw
    elif kind in (betterproto2.TYPE_INT32, betterproto2.TYPE_INT64, betterproto2.TYPE_BOOL):
        return integer
    elif kind == betterproto2.TYPE_MAP and [m.proto_type for m in meta.map_meta] == [
        betterproto2.TYPE_STRING,
        betterproto2.TYPE_INT32,
    ]:
        return priorities
    elif kind == betterproto2.TYPE_MESSAGE and unwrapped is Timestamp:
        return timestamp
    raise TypeError(f"encode_record does not write {cls.__name__} field {meta.number} ({kind})")


def _len(data: bytes) -> bytes:
    return _varint(len(data)) + data


def _layout(cls: type) -> tuple[tuple[str, _Field], ...]:
    """*cls*'s fields in number order, each with its writer, from betterproto2's metadata."""
    metadata = cls._betterproto  # type: ignore[attr-defined]
    return tuple(
        (name, _field_writer(cls, metadata.meta_by_field_name[name]))
        for name in metadata.sorted_field_names
    )


_RECORD_LAYOUTS = {
    cls: _layout(cls) for cls in (ServerInfo, WorkerInfo, SchedulerEntry, SchedulerEnqueueEvent)
}

Record = ServerInfo | WorkerInfo | SchedulerEntry | SchedulerEnqueueEvent


def encode_record(msg: Record) -> bytes:
    """*msg*'s proto3 bytes, as ``bytes(msg)`` writes them without betterproto2's pydantic
    check (see the module docstring); unknown fields are kept, as betterproto2 keeps them."""
    out = b"".join(write(getattr(msg, name)) for name, write in _RECORD_LAYOUTS[type(msg)])
    unknown = getattr(msg, "_unknown_fields", b"")
    return out + bytes(unknown) if unknown else out
