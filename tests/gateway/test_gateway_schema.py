"""The gateway's input conversions, over generated inputs: durations, instants, payloads."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import Inspector
from asyncq.gateway import create_app
from asyncq.gateway._schema import EnqueueRequest, encode_bytes

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(h=st.integers(0, 10_000), m=st.integers(0, 59), s=st.integers(0, 59), ms=st.integers(0, 999))
def test_go_duration_strings(h: int, m: int, s: int, ms: int) -> None:
    want = timedelta(hours=h, minutes=m, seconds=s, milliseconds=ms)
    for text in (f"{h}h{m}m{s}s", f"{h}h{m}m{s}.{ms:03d}s", f"{h * 3600 + m * 60 + s}s"):
        got = EnqueueRequest.model_validate({"type": "t", "retention": text}).retention
        assert got is not None
        assert abs(got - want) < timedelta(seconds=1) if "." not in text else got == want


@given(st.integers(1, 10**9) | st.floats(1, 1e9))
def test_duration_seconds(value: float) -> None:
    req = EnqueueRequest.model_validate({"type": "t", "timeout": value})
    assert req.timeout == timedelta(seconds=value)


@given(
    st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(9000, 1, 1), timezones=st.timezones()
    )
)
def test_instants_keep_their_moment(when: datetime) -> None:
    text = when.isoformat()  # RFC 3339 with the offset in force at that local time
    req = EnqueueRequest.model_validate({"type": "t", "deadline": text})
    assert req.deadline == datetime.fromisoformat(text)
    assert req.deadline is not None and req.deadline.utcoffset() == when.utcoffset()


@given(_JSON)
def test_json_payload_is_stored_compact(value: Any) -> None:
    req = EnqueueRequest.model_validate({"type": "t", "payload": value})
    stored = req.payload_bytes()
    assert stored == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    shown, encoding = encode_bytes(stored)
    assert encoding == "json" and shown == value


@given(st.binary())
def test_shown_bytes_decode_back(data: bytes) -> None:
    shown, encoding = encode_bytes(data)
    if encoding == "base64":
        assert base64.b64decode(str(shown)) == data
    elif encoding == "text":
        assert str(shown).encode() == data
    else:
        assert json.loads(data) == shown


@pytest.fixture
async def gateway(redis: Redis, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(redis_url)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        yield c
    await app.state.gateway.aclose()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=300), encoding=st.sampled_from(["base64", "text"]))
async def test_bytes_payloads_are_stored_exactly(
    gateway: httpx.AsyncClient, redis: Redis, data: bytes, encoding: str
) -> None:
    if encoding == "text":
        data = data.decode(errors="replace").encode()
        sent = data.decode()
    else:
        sent = base64.b64encode(data).decode()
    r = await gateway.post(
        "/api/queues/default/tasks",
        json={"type": "bin", "payload": sent, "payload_encoding": encoding},
    )
    assert r.status_code == 201, r.text
    async with Inspector(redis) as insp:
        info = await insp.get_task("default", r.json()["id"])
    assert info.payload == data
    assert info.next_process_at is not None and info.next_process_at <= datetime.now(UTC)
