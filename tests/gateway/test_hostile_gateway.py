"""The gateway under hostile bodies (issue 25 items 2 and 12): everything is validated before
anything is written, so an error answer never follows a write."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import Client, Task
from asyncq._http import quote_segment
from asyncq.gateway import create_app

TASKS = "/api/queues/default/tasks"


@pytest.fixture
async def gw(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(redis_url)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        yield c
    await app.state.gateway.aclose()


async def _post_raw(gw: httpx.AsyncClient, body: bytes | str, path: str = TASKS) -> httpx.Response:
    return await gw.post(
        path,
        content=body.encode() if isinstance(body, str) else body,
        headers={"Content-Type": "application/json"},
    )


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "body",
    [
        '{"type":"t","payload":1e999,"task_id":"bad"}',
        '{"type":"t","payload":-1e400,"task_id":"bad"}',
        '{"type":"t","payload":{"a":[1E999]},"task_id":"bad"}',
        '{"type":"t","payload":' + _nested(300) + ',"task_id":"bad"}',
        '{"type":"t","payload":' + _nested(3000) + ',"task_id":"bad"}',
        '{"type":"t","payload":' + _nested(5000) + ',"task_id":"bad"}',
        _nested(6000),
    ],
    ids=["1e999", "-1e400", "nested-inf", "depth300", "depth3000", "depth5000", "bare6000"],
)
async def test_a_refused_body_writes_nothing(
    gw: httpx.AsyncClient, redis: Redis, body: str
) -> None:
    r = await _post_raw(gw, body)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["code"] in ("invalid_json", "invalid_request")
    assert err["message"]
    assert await redis.keys("asynq:{default}:t:*") == []
    again = await _post_raw(gw, body)
    assert again.status_code == 400  # not 409: nothing was written the first time


async def test_a_batch_with_infinity_is_refused_whole(gw: httpx.AsyncClient, redis: Redis) -> None:
    body = '{"tasks":[{"type":"t","payload":1e999,"task_id":"bad"},{"type":"t","task_id":"ok"}]}'
    r = await _post_raw(gw, body, TASKS + "/batch")
    # 1e999 has no JSON value here (it would be stored as the non-JSON `Infinity`): the
    # body is refused as a whole, before anything is written.
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_json"
    assert "1e999" in r.json()["error"]["message"]
    assert await redis.keys("asynq:{default}:t:*") == []


@pytest.mark.parametrize(
    "stored",
    [b"Infinity", b"NaN", b"1e999", b"-Infinity", _nested(3000).encode(), _nested(300).encode()],
    ids=["Infinity", "NaN", "1e999", "-Infinity", "depth3000", "depth300"],
)
async def test_any_stored_payload_reads_back(
    gw: httpx.AsyncClient, redis: Redis, stored: bytes
) -> None:
    # Written by another producer (Go, or asyncq's Client): the gateway reads it as text.
    async with Client(redis) as client:
        await client.enqueue(Task("t", stored), task_id="x")
    r = await gw.get(TASKS + "/x")
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    assert body["payload_encoding"] == "text"
    assert body["payload"] == stored.decode()


async def test_a_deep_base64_payload_is_stored_and_read_as_text(
    gw: httpx.AsyncClient, redis: Redis
) -> None:
    raw = _nested(3000).encode()
    item = {"type": "t", "payload": base64.b64encode(raw).decode(), "payload_encoding": "base64"}
    r = await gw.post(TASKS, json={**item, "task_id": "deep"})
    assert r.status_code == 201, r.text[:300]
    assert r.json()["payload"] == raw.decode()
    got = await gw.get(TASKS + "/deep")
    assert got.status_code == 200 and got.json()["payload"] == raw.decode()


# Item 12: loose input is refused, naming the field.
@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"max_retry": "3"}, "max_retry"),
        ({"max_retry": True}, "max_retry"),
        ({"max_retry": 3.0}, "max_retry"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": "0s"}, "timeout"),
        ({"timeout": 0.5}, "timeout"),
        ({"deadline": "1900000000"}, "deadline"),
        ({"process_at": "1900000000"}, "process_at"),
    ],
)
async def test_loose_input_is_refused_naming_the_field(
    gw: httpx.AsyncClient, redis: Redis, extra: dict[str, object], field: str
) -> None:
    r = await gw.post(TASKS, json={"type": "t", "task_id": "loose", **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["field"] == field, err
    assert field in err["message"], err
    assert await redis.keys("asynq:{default}:t:*") == []


@pytest.mark.parametrize(
    "body",
    [
        '{"type":"t"}'.encode("utf-16"),
        '{"type":"t"}'.encode("utf-16-le"),
        '{"type":"t"}'.encode("utf-32"),
        b"\xef\xbb\xbf" + b'{"type":"t"}',
        b'{"type":"t\xff"}',
    ],
    ids=["utf16-bom", "utf16-le", "utf32", "utf8-bom", "latin1"],
)
async def test_a_body_that_is_not_plain_utf8_is_refused(
    gw: httpx.AsyncClient, redis: Redis, body: bytes
) -> None:
    r = await _post_raw(gw, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_json"
    assert "UTF-8" in r.json()["error"]["message"]
    assert await redis.keys("asynq:{default}:t:*") == []


async def test_strict_input_still_takes_every_documented_form(gw: httpx.AsyncClient) -> None:
    for extra in (
        {"max_retry": 0},
        {"timeout": 1},
        {"timeout": "90s"},
        {"deadline": 1900000000},
        {"deadline": "2030-03-17T17:46:40Z"},
        {"retention": 0},
    ):
        r = await gw.post(TASKS, json={"type": "t", **extra})
        assert r.status_code == 201, (extra, r.text)


# Beyond the list: whatever the gateway refuses, Redis is left exactly as it was.
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["", " ", "90s", "-1s", "0s", "1h", "PT90S", "2030-01-01T00:00:00Z",
                      "2030-01-01T00:00:00", "json", "base64", "text", "!!", "a{b}", "1e999"])
)  # fmt: skip
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_FIELDS = st.sampled_from(
    [
        "type", "payload", "payload_encoding", "task_id", "max_retry", "timeout", "deadline",
        "process_at", "process_in", "unique", "retention", "group", "headers", "queue", "bogus",
    ]
)  # fmt: skip
_ITEMS = st.dictionaries(_FIELDS, _VALUES, max_size=6)
_RAW_NUMBERS = st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "1" * 5000, "[" * 3000])


async def _snapshot(redis: Redis) -> dict[bytes, bytes | None]:
    return {key: await redis.dump(key) async for key in redis.scan_iter(count=1000)}


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    item=_ITEMS,
    batch=st.booleans(),
    splice=st.none() | _RAW_NUMBERS,
    queue=st.sampled_from(["default", "a:b", " ", "x{y}"]),
)
async def test_any_refused_request_leaves_redis_unchanged(
    gw: httpx.AsyncClient,
    redis: Redis,
    item: dict[str, object],
    batch: bool,
    splice: str | None,
    queue: str,
) -> None:
    await redis.flushdb()
    async with Client(redis) as client:  # something already there, to be left alone
        await client.enqueue(Task("seed", b"s"), queue="default", task_id="seed")
    before = await _snapshot(redis)
    body = json.dumps({"tasks": [item]} if batch else item)
    if splice is not None:
        body = body.replace("null", splice, 1) if "null" in body else body[:-1] + f',"x":{splice}}}'
    path = f"/api/queues/{quote_segment(queue)}/tasks" + ("/batch" if batch else "")
    r = await _post_raw(gw, body, path)
    refused = r.status_code >= 400 or (
        batch and r.status_code == 200 and all(x["status"] >= 400 for x in r.json()["results"])
    )
    assert r.status_code < 500, r.text[:300]
    if refused:
        assert await _snapshot(redis) == before, (r.status_code, r.text[:300])
    else:
        assert r.status_code in (200, 201), r.text[:300]
