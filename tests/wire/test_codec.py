"""The hand-written TaskMessage codec agrees with betterproto2 byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncq._codec import decode_task_message, encode_task_headers, encode_task_message
from asyncq.proto.asynq import TaskMessage

int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
text = st.text(max_size=40)

messages = st.builds(
    TaskMessage,
    type=text,
    payload=st.binary(max_size=200),
    id=text,
    queue=text,
    retry=int32,
    retried=int32,
    error_msg=text,
    timeout=int64,
    deadline=int64,
    unique_key=text,
    last_failed_at=int64,
    retention=int64,
    completed_at=int64,
    group_key=text,
    headers=st.dictionaries(text, text, max_size=4),
)


@given(messages)
@settings(max_examples=300, deadline=None)
def test_encode_matches_betterproto2(msg: TaskMessage) -> None:
    assert encode_task_message(msg) == bytes(msg)


@given(messages)
@settings(max_examples=300, deadline=None)
def test_decode_matches_betterproto2(msg: TaskMessage) -> None:
    data = bytes(msg)
    decoded = decode_task_message(data)
    assert decoded == TaskMessage.parse(data)
    assert decoded == msg


def test_unknown_fields_survive_a_round_trip() -> None:
    # Field 16 (varint 7) and field 20 (bytes "zz"): what a newer asynq could add.
    base = bytes(TaskMessage(type="t", id="i", queue="q"))
    extra = b"\x80\x01\x07" + b"\xa2\x01\x02zz"
    decoded = decode_task_message(base + extra)
    assert decoded.type == "t"
    assert encode_task_message(decoded) == base + extra


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a\x05ab",  # string longer than the buffer
        b"\x28",  # varint cut off
        b"\x0a\x02\xff\xfe",  # invalid UTF-8 in `type`
        b"\x00\x01",  # field number 0
        b"\x2f",  # wire type 7 does not exist
        b"\x28" + b"\xff" * 11,  # varint longer than 10 bytes
    ],
)
def test_malformed_bytes_raise_value_error(data: bytes) -> None:
    with pytest.raises(ValueError, match="TaskMessage"):
        decode_task_message(data)


def test_a_repeated_header_key_keeps_the_last_value() -> None:
    # Protobuf map semantics (protobuf-go, betterproto2): of two entries with one key, the
    # last wins. asyncq never writes two, but another producer's message may hold them.
    first = encode_task_headers({"trace": "old", "tenant": "a"})
    last = encode_task_headers({"trace": "new"})
    data = bytes(TaskMessage(type="t", id="i")) + first + last
    decoded = decode_task_message(data)
    assert decoded.headers == {"trace": "new", "tenant": "a"}
    assert decoded.headers == TaskMessage.parse(data).headers


def _entry(key: bytes, value: bytes, order: str) -> bytes:
    """One headers map entry, its parts in *order* ("kv", "vk", or "kxv" with an unknown
    field between key and value); lengths as varints, so long ones take two bytes."""
    parts = {
        "k": b"\x0a" + _varint(len(key)) + key,
        "v": b"\x12" + _varint(len(value)) + value,
        "x": b"\x18\x01",
    }
    inner = b"".join(parts[c] for c in order)
    return b"\x7a" + _varint(len(inner)) + inner


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


header_text = st.text(max_size=150).map(str.encode)
entries = st.builds(_entry, header_text, header_text, st.sampled_from(["kv", "vk", "kxv", "v"]))
single_fields = messages.flatmap(
    lambda msg: st.sampled_from([bytes(m) for m in _one_field_each(msg)] or [b""])
)


def _one_field_each(msg: TaskMessage) -> list[TaskMessage]:
    names = [n for n in vars(TaskMessage()) if not n.startswith("_") and n != "headers"]
    return [TaskMessage(**{n: getattr(msg, n)}) for n in names if getattr(msg, n)]


@given(st.lists(st.one_of(entries, single_fields), max_size=12))
@settings(max_examples=300, deadline=None)
def test_fields_in_any_order_and_any_entry_shape_decode_as_betterproto2(
    chunks: list[bytes],
) -> None:
    # What another producer may write: fields out of order or repeated (the last wins),
    # map entries with their value first, an unknown field inside, or no key, and
    # lengths of two bytes.
    data = b"".join(chunks)
    assert decode_task_message(data) == TaskMessage.parse(data)


def test_a_decoded_message_has_the_attributes_of_a_constructed_one() -> None:
    msg = TaskMessage(type="t", payload=b"p", id="i", queue="q", timeout=1800)
    decoded = decode_task_message(bytes(msg))
    assert vars(decoded) == vars(msg)
    assert decoded.headers is not decode_task_message(bytes(msg)).headers


@pytest.mark.parametrize("size", [127, 128, 16_383, 16_384, 70_000])
def test_long_fields_decode_as_betterproto2(size: int) -> None:
    # Lengths of one to three bytes, in a bytes field, a string field and a header entry.
    msg = TaskMessage(
        type="t" * size, payload=b"p" * size, id="i", queue="q", headers={"k": "v" * size}
    )
    data = bytes(msg)
    assert decode_task_message(data) == TaskMessage.parse(data) == msg


def test_unknown_fields_of_every_wire_type_are_kept_in_place() -> None:
    # Field 16 as a varint, field 17 as fixed64, field 18 as fixed32 and field 19 as bytes,
    # each followed by a known field that must still decode.
    base = bytes(TaskMessage(type="t", id="i", queue="q"))
    extra = (
        b"\x80\x01\x96\x01"  # 16: varint 150
        + b"\x89\x01"
        + bytes(range(8))  # 17: fixed64
        + b"\x95\x01"
        + bytes(range(4))  # 18: fixed32
        + b"\x9a\x01\x03abc"  # 19: bytes
    )
    after = bytes(TaskMessage(retry=3))
    data = base + extra + after
    decoded = decode_task_message(data)
    assert (decoded.type, decoded.retry) == ("t", 3)
    assert encode_task_message(decoded) == base + after + extra


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\x08" + b"\xff" * 11 + b"\x01", "varint longer than 10 bytes in TaskMessage"),
        (b"\x0a\x05abc", "truncated field in TaskMessage"),  # type: 5 bytes, 3 there
    ],
)
def test_malformed_bytes_are_named_exactly(data: bytes, error: str) -> None:
    with pytest.raises(ValueError) as raised:
        decode_task_message(data)
    assert str(raised.value) == error


@pytest.mark.parametrize("size", [121, 122, 123, 124, 125])
def test_header_entries_around_one_length_byte_encode_as_betterproto2(size: int) -> None:
    # An entry of 4 + key + value bytes: 127 still takes one length byte, 128 takes two.
    msg = TaskMessage(type="t", id="i", queue="q", headers={"k": "v" * size, "kk": "w" * size})
    assert encode_task_message(msg) == bytes(msg)
    assert decode_task_message(bytes(msg)) == msg
