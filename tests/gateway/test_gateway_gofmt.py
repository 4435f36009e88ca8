"""Tasks enqueued over HTTP are stored exactly as Go asynq v0.26's Client.Enqueue stores them.

tests/fixtures/go-asynq-v0.26/enqueue_bytes.json holds the bytes the real Go
library wrote for eleven enqueues, one option each. Here the same enqueues go
through the HTTP gateway, and the Redis data is compared: the protobuf ``msg``
byte for byte (decoded field by field with a small independent wire decoder,
so a mismatch names the field), the task hash's other fields, and every key
of the database with its type and members. Only times (``pending_since``, the
group's score, the unique lock's remaining TTL) are left out, as the fixture
says they vary. Then a task enqueued over HTTP is processed by an asyncq
handler and its result read back over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from asyncq import ServeMux, Server, Task
from asyncq.gateway import create_app
from tests.support.procs import FAST

FIXTURE = Path(__file__).parents[1] / "fixtures" / "go-asynq-v0.26" / "enqueue_bytes.json"
GO = json.loads(FIXTURE.read_text())
ENQUEUES = GO["enqueues"]


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def decode_fields(buf: bytes) -> list[tuple[int, Any]]:
    """(field number, int or bytes) in wire order; proto3 wire types 0 and 2 only."""
    out: list[tuple[int, Any]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i : i + size], i + size
        else:
            raise AssertionError(f"unexpected wire type {wire} for field {num}")
        out.append((num, value))
    return out


NAMES = {
    1: "type",
    2: "payload",
    3: "id",
    4: "queue",
    5: "retry",
    6: "retried",
    7: "error_msg",
    8: "timeout",
    9: "deadline",
    10: "unique_key",
    11: "last_failed_at",
    12: "retention",
    13: "completed_at",
    14: "group_key",
}


def decode_message(raw: bytes) -> dict[str, Any]:
    """A TaskMessage as the fixture's ``msg_decoded`` shows it (headers as a dict)."""
    fields = decode_fields(raw)
    view: dict[str, Any] = {"_field_order": [n for n, _ in fields]}
    for num, value in fields:
        if num == 15:
            entry = dict(decode_fields(value))
            view.setdefault("headers", {})[entry[1].decode()] = entry[2].decode()
        elif num == 2:
            view["payload"] = {"hex": value.hex(), "len": len(value)}
        elif isinstance(value, bytes):
            view[NAMES[num]] = value.decode()
        else:
            view[NAMES[num]] = value
    return view


def _go_time(text: str) -> str:
    when = datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S UTC %Y")
    return when.replace(tzinfo=UTC).isoformat()


def http_request(enqueue: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The gateway call for one fixture enqueue: (queue, JSON body)."""
    body: dict[str, Any] = {"type": enqueue["type"], "payload": json.loads(enqueue["payload"])}
    queue = "default"
    for option in enqueue["options"]:
        m = re.fullmatch(r"(\w+)\((.*)\)", option)
        assert m is not None, option
        name, arg = m.groups()
        if name == "TaskID":
            body["task_id"] = json.loads(arg)
        elif name == "Queue":
            queue = json.loads(arg)
        elif name == "Group":
            body["group"] = json.loads(arg)
        elif name == "MaxRetry":
            body["max_retry"] = int(arg)
        elif name in ("Timeout", "Unique", "Retention"):
            body[name.lower()] = arg  # a Go duration string, e.g. 1m30s
        elif name in ("Deadline", "ProcessAt"):
            body["deadline" if name == "Deadline" else "process_at"] = _go_time(arg)
        else:
            raise AssertionError(f"unknown option {option}")
    if enqueue["headers"]:
        body["headers"] = enqueue["headers"]
    return queue, body


async def _dump(redis: Redis) -> dict[str, tuple[str, Any]]:
    """Every key: (type, members without time-dependent values)."""
    out: dict[str, tuple[str, Any]] = {}
    for raw in sorted(await redis.keys("*")):
        key = raw.decode()
        kind = (await redis.type(raw)).decode()
        value: Any
        if kind == "set":
            value = sorted(m.decode() for m in await redis.smembers(raw))
        elif kind == "list":
            value = [m.decode() for m in await redis.lrange(raw, 0, -1)]
        elif kind == "zset":
            value = [m.decode() for m in await redis.zrange(raw, 0, -1)]
        elif kind == "hash":
            value = sorted(k.decode() for k in await redis.hkeys(raw))
        else:
            value = (await redis.get(raw) or b"").decode()
        out[key] = (kind, value)
    return out


def _fixture_dump() -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for entry in GO["db_dump"]:
        kind, value = entry["type"], entry.get("text", entry["value"])
        if kind == "set":
            value = sorted(value)
        elif kind == "zset":
            value = [m for m, _ in value]
        elif kind == "hash":
            value = sorted(entry["value"])
        out[entry["key"]] = (kind, value)
    return out


@pytest.fixture
async def gateway(redis: Redis, redis_url: str) -> Any:
    app = create_app(redis_url)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        yield c
    await app.state.gateway.aclose()


async def test_http_enqueues_match_go_bytes(gateway: httpx.AsyncClient, redis: Redis) -> None:
    for enqueue in ENQUEUES:
        queue, body = http_request(enqueue)
        r = await gateway.post(f"/api/queues/{queue}/tasks", json=body)
        assert r.status_code == 201, (enqueue["id"], r.text)
        assert r.json()["state"] == enqueue["state"]
        task_hash = await redis.hgetall(f"asynq:{{{queue}}}:t:{enqueue['id']}")
        raw = task_hash.pop(b"msg")
        expected = bytes.fromhex(enqueue["msg_hex"])
        want = {k: v for k, v in enqueue["msg_decoded"].items() if not k.startswith("_")}
        want["_field_order"] = enqueue["msg_decoded"]["_field_order"]
        want["payload"] = {k: want["payload"][k] for k in ("hex", "len")}
        assert decode_message(raw) == want, enqueue["id"]
        if len(enqueue["headers"] or {}) <= 1:  # Go orders map entries at random
            assert raw == expected, enqueue["id"]
        else:
            assert sorted(decode_fields(raw)) == sorted(decode_fields(expected))
        other = {k.decode(): v.decode() for k, v in task_hash.items()}
        go_other = enqueue["task_hash_other_fields"]
        assert set(other) == set(go_other), enqueue["id"]
        for name in set(go_other) - {"pending_since"}:
            assert other[name] == go_other[name], (enqueue["id"], name)
        if "pending_since" in other:
            assert abs(int(other["pending_since"]) / 1e9 - datetime.now(UTC).timestamp()) < 60
    assert await _dump(redis) == _fixture_dump()
    (unique,) = [e for e in GO["db_dump"] if ":unique:" in e["key"]]
    assert 3590 < await redis.ttl(unique["key"]) <= 3600


async def test_http_task_processed_by_an_asyncq_handler(
    gateway: httpx.AsyncClient, redis: Redis
) -> None:
    seen: list[Task] = []
    mux = ServeMux()

    @mux.handler("email:send")
    async def send(task: Task) -> None:
        seen.append(task)
        assert task.result_writer is not None
        await task.result_writer.write(json.dumps({"sent_to": task.json()["to"]}).encode())

    r = await gateway.post(
        "/api/queues/default/tasks",
        json={
            "type": "email:send",
            "payload": {"to": "user@example.com"},
            "headers": {"tenant": "acme"},
            "max_retry": 2,
            "retention": "1h",
        },
    )
    assert r.status_code == 201
    task_id = r.json()["id"]
    server = Server(redis, concurrency=1, burst=True, **FAST)
    await asyncio.wait_for(server.run(mux), 30)
    (task,) = seen
    assert (task.id, task.queue, task.max_retry) == (task_id, "default", 2)
    assert task.headers == {"tenant": "acme"}
    assert task.payload == b'{"to":"user@example.com"}'
    got = (await gateway.get(f"/api/queues/default/tasks/{task_id}")).json()
    assert got["state"] == "completed"
    assert got["result"] == {"sent_to": "user@example.com"}
    assert got["result_encoding"] == "json"
    completed = datetime.fromisoformat(got["completed_at"])
    assert datetime.now(UTC) - completed < timedelta(minutes=1)
