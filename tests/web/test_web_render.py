"""Payload/result rendering for the web UI: JSON, text or a hex dump, for any bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncq._duration import format_short
from asyncq.web._render import body, relative


@settings(deadline=None)  # a shared, busy machine: no per-example time limit
@given(st.binary(max_size=300))
def test_any_bytes_render(data: bytes) -> None:
    b = body(data)
    assert b.size == len(data)
    assert b.kind in ("empty", "json", "text", "hex")
    assert len(b.short(50)) <= 50
    if b.kind == "json":
        assert json.loads(b.text) == json.loads(data)
    if b.kind == "text":
        assert b.text == data.decode()
    if b.kind == "hex" and len(data) <= 16:
        assert b.text.split("  ")[1].split() == [f"{x:02x}" for x in data]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda c: st.lists(c) | st.dictionaries(st.text(), c),
    max_leaves=10,
)


@settings(deadline=None)  # a shared, busy machine: no per-example time limit
@given(JSON_VALUES)
def test_json_is_pretty_printed(value: object) -> None:
    b = body(json.dumps(value).encode())
    assert b.kind == "json"
    assert json.loads(b.text) == value


def test_examples() -> None:
    assert body(None).kind == "empty"
    assert body(b"hello world").kind == "text"
    assert body(b"\x00\xff").text.startswith("00000000  00 ff")
    big = body(bytes(range(256)) * 20, hex_limit=32)
    assert big.text.endswith("… 5088 more bytes")
    assert format_short(timedelta(hours=1, minutes=2, seconds=3)) == "1h2m"
    assert format_short(timedelta(seconds=59)) == "59s"
    assert format_short(timedelta(milliseconds=250)) == "250ms"
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert relative(now + timedelta(minutes=5), now) == "in 5m"
    assert relative(now - timedelta(seconds=7), now) == "7s ago"
    assert relative(None, now) == "-"
