"""The HTTP enqueue gateway: every option and error, through the ASGI app and a real server.

Each case runs twice: in process through httpx's ASGITransport, and against a
real ``asyncq gateway`` process (uvicorn) over TCP.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import structlog
from click.testing import CliRunner
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.routing import Mount

from asyncq import Client, RetryPolicy
from asyncq.cli import main
from asyncq.gateway import create_app
from tests.support.gateway_util import gateway_process
from tests.support.redis_server import free_port

TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUEUE = "critical:high-prio"
TASKS = f"/api/queues/{QUEUE}/tasks"
MAX_BODY = 4096
MAX_BATCH = 5


@pytest.fixture(scope="module")
def gateway_url(redis_url: str) -> Any:
    args = ("--token", TOKEN, "--max-body", str(MAX_BODY), "--max-batch", str(MAX_BATCH))
    with gateway_process(redis_url, *args) as (base, _):
        yield base


@pytest.fixture(params=["asgi", "uvicorn"])
async def api(
    request: pytest.FixtureRequest, redis: Redis, redis_url: str
) -> AsyncIterator[httpx.AsyncClient]:
    if request.param == "asgi":
        app = create_app(redis_url, token=TOKEN, max_body_bytes=MAX_BODY, max_batch=MAX_BATCH)
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", headers=AUTH
        ) as c:
            yield c
        await app.state.gateway.aclose()
    else:
        base = request.getfixturevalue("gateway_url")
        # The long-running gateway's Client registered the queue once (asynq caches that,
        # as Go's client does); the flush between tests removed it, so put it back.
        await redis.sadd("asynq:queues", QUEUE)
        async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=30) as c:
            yield c


def _subset(expected: dict[str, Any], got: dict[str, Any]) -> None:
    for key, value in expected.items():
        assert got[key] == value, (key, got)


BASE = {"type": "email:send", "payload": {"to": "a@example.com"}}

OPTION_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "defaults",
        {},
        {
            "type": "email:send",
            "queue": QUEUE,
            "state": "pending",
            "payload": {"to": "a@example.com"},
            "payload_encoding": "json",
            "max_retry": 25,
            "retried": 0,
            "timeout": 1800,
            "deadline": None,
            "group": None,
            "retention": None,
            "headers": {},
            "result": None,
        },
    ),
    ("task_id", {"task_id": "order-42"}, {"id": "order-42"}),
    ("max_retry", {"max_retry": 3}, {"max_retry": 3}),
    ("max_retry_zero", {"max_retry": 0}, {"max_retry": 0}),
    ("timeout_go", {"timeout": "1m30s"}, {"timeout": 90}),
    ("timeout_seconds", {"timeout": 90}, {"timeout": 90}),
    ("timeout_iso", {"timeout": "PT90S"}, {"timeout": 90}),
    (
        "deadline",
        {"deadline": "2099-12-31T23:59:59Z"},
        {"deadline": "2099-12-31T23:59:59Z", "timeout": None},
    ),
    (
        "deadline_offset",
        {"deadline": "2100-01-01T01:59:59+02:00"},
        {"deadline": "2099-12-31T23:59:59Z"},
    ),
    (
        "deadline_and_timeout",
        {"deadline": "2099-12-31T23:59:59Z", "timeout": "10s"},
        {"deadline": "2099-12-31T23:59:59Z", "timeout": 10},
    ),
    (
        "process_at",
        {"process_at": "2100-01-01T00:00:00Z"},
        {"state": "scheduled", "next_process_at": "2100-01-01T00:00:00Z"},
    ),
    (
        "process_at_unix",
        {"process_at": 4102444800},
        {"state": "scheduled", "next_process_at": "2100-01-01T00:00:00Z"},
    ),
    ("process_in", {"process_in": "1h"}, {"state": "scheduled"}),
    ("unique", {"unique": "1h"}, {"state": "pending"}),
    ("retention", {"retention": "24h"}, {"retention": 86400}),
    ("group", {"group": "g1"}, {"state": "aggregating", "group": "g1", "next_process_at": None}),
    (
        "headers",
        {"headers": {"tenant": "acme", "trace-id": "abc123"}},
        {"headers": {"tenant": "acme", "trace-id": "abc123"}},
    ),
    (
        "base64",
        {"payload": base64.b64encode(b"\x00\xffbin").decode(), "payload_encoding": "base64"},
        {"payload": base64.b64encode(b"\x00\xffbin").decode(), "payload_encoding": "base64"},
    ),
    (
        "text",
        {"payload": "héllo wörld", "payload_encoding": "text"},
        {"payload": "héllo wörld", "payload_encoding": "text"},
    ),
    ("json_null", {"payload": None}, {"payload": None, "payload_encoding": "json"}),
    ("json_list", {"payload": [1, "two", 3.5]}, {"payload": [1, "two", 3.5]}),
]


@pytest.mark.parametrize(
    ("name", "extra", "expected"), OPTION_CASES, ids=[c[0] for c in OPTION_CASES]
)
async def test_enqueue_option(
    api: httpx.AsyncClient,
    redis: Redis,
    name: str,
    extra: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    before = datetime.now(UTC)
    r = await api.post(TASKS, json={**BASE, **extra})
    assert r.status_code == 201, r.text
    body = r.json()
    _subset(expected, body)
    task_id = body["id"]
    stored = await redis.hgetall(f"asynq:{{{QUEUE}}}:t:{task_id}")
    assert stored[b"state"].decode() == body["state"]
    # The same task read back through the GET endpoint.
    got = await api.get(f"{TASKS}/{task_id}")
    assert got.status_code == 200, got.text
    _subset({k: v for k, v in expected.items() if k != "next_process_at"}, got.json())
    assert got.json()["state"] == body["state"]
    if name == "process_in":
        at = datetime.fromisoformat(body["next_process_at"])
        assert before + timedelta(hours=1) <= at <= datetime.now(UTC) + timedelta(hours=1)
        assert await redis.zscore(f"asynq:{{{QUEUE}}}:scheduled", task_id) is not None
    if name == "unique":
        keys = await redis.keys(f"asynq:{{{QUEUE}}}:unique:*")
        assert len(keys) == 1
        assert 3590 < await redis.ttl(keys[0]) <= 3600
        again = await api.post(TASKS, json={**BASE, **extra})
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "duplicate_task"
    if name == "group":
        assert await redis.zscore(f"asynq:{{{QUEUE}}}:g:g1", task_id) is not None
    if name == "base64":
        assert got.json()["payload"] == base64.b64encode(b"\x00\xffbin").decode()


ERROR_CASES: list[tuple[Any, str | None]] = [
    ({"payload": 1}, "type"),
    ({"type": ""}, "type"),
    ({"type": "   "}, "type"),
    ({"type": 5}, "type"),
    ({"type": "a", "bogus": 1}, "bogus"),
    ({"type": "a", "queue": "other"}, "queue"),
    ({"type": "a", "timeout": "soon"}, "timeout"),
    ({"type": "a", "timeout": -5}, "timeout"),
    ({"type": "a", "timeout": 0.5}, "timeout"),
    ({"type": "a", "timeout": True}, "timeout"),
    ({"type": "a", "unique": "500ms"}, "unique"),
    ({"type": "a", "process_in": "-1s"}, "process_in"),
    ({"type": "a", "retention": -1}, "retention"),
    ({"type": "a", "process_at": "2100-01-01T00:00:00Z", "process_in": 5}, "process_in"),
    ({"type": "a", "process_at": "2100-01-01T00:00:00"}, "process_at"),
    ({"type": "a", "deadline": "tomorrow"}, "deadline"),
    ({"type": "a", "max_retry": -1}, "max_retry"),
    ({"type": "a", "max_retry": 2**31}, "max_retry"),
    ({"type": "a", "max_retry": "many"}, "max_retry"),
    ({"type": "a", "task_id": ""}, "task_id"),
    ({"type": "a", "group": " "}, "group"),
    ({"type": "a", "headers": {"k": 1}}, "headers.k"),
    ({"type": "a", "headers": ["k"]}, "headers"),
    ({"type": "a", "payload": "%%%", "payload_encoding": "base64"}, "payload"),
    ({"type": "a", "payload": {"x": 1}, "payload_encoding": "base64"}, "payload"),
    ({"type": "a", "payload": 5, "payload_encoding": "text"}, "payload"),
    ({"type": "a", "payload_encoding": "hex"}, "payload_encoding"),
    ([{"type": "a"}], None),
    ("just a string", None),
]


@pytest.mark.parametrize(
    ("body", "field"), ERROR_CASES, ids=[str(i) for i in range(len(ERROR_CASES))]
)
async def test_bad_input_is_400_naming_the_field(
    api: httpx.AsyncClient, redis: Redis, body: Any, field: str | None
) -> None:
    r = await api.post(TASKS, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["field"] == field
    assert error["message"]
    if field is not None:
        assert field.split(".")[0] in error["message"] or field == "payload"
    assert await redis.keys("asynq:*:t:*") == []  # nothing was written


async def test_bad_json_content_type_and_sizes(api: httpx.AsyncClient, redis: Redis) -> None:
    r = await api.post(TASKS, content=b'{"type": ', headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json")
    for constant in (
        b"NaN",
        b"Infinity",
        b"-Infinity",
    ):  # Python's json accepts them; JSON does not
        r = await api.post(
            TASKS,
            content=b'{"type": "a", "payload": ' + constant + b"}",
            headers={"Content-Type": "application/json"},
        )
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json"), r.text
    r = await api.post(TASKS, content=b'{"type": "a"}', headers={"Content-Type": "text/plain"})
    assert (r.status_code, r.json()["error"]["code"]) == (415, "unsupported_media_type")
    r = await api.post(TASKS, content=b'{"type": "a"}')
    assert r.status_code == 415
    # Charset parameters are fine.
    r = await api.post(
        TASKS, content=b'{"type": "a"}', headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert r.status_code == 201, r.text
    big = {"type": "a", "payload": "x" * MAX_BODY}
    r = await api.post(TASKS, json=big)
    assert (r.status_code, r.json()["error"]["code"]) == (413, "payload_too_large")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while read
        yield b'{"type": "a", "payload": "'
        for _ in range(MAX_BODY // 512 + 1):
            yield b"y" * 512
        yield b'"}'

    r = await api.post(TASKS, content=chunks(), headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["error"]["code"]) == (413, "payload_too_large")
    assert len(await redis.keys("asynq:*:t:*")) == 1  # only the charset one


async def test_token_is_checked(api: httpx.AsyncClient) -> None:
    for headers in (
        {"Authorization": ""},
        {"Authorization": "Bearer wrong"},
        {"Authorization": TOKEN},
    ):
        r = await api.post(TASKS, json=BASE, headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        r = await api.get(f"{TASKS}/x", headers=headers)
        assert r.status_code == 401
    r = await api.post(TASKS, json=BASE, headers={"Authorization": "bearer " + TOKEN})
    assert r.status_code == 401  # the scheme is matched exactly


async def test_conflicts_are_409(api: httpx.AsyncClient) -> None:
    r = await api.post(TASKS, json={**BASE, "task_id": "same"})
    assert r.status_code == 201
    r = await api.post(TASKS, json={"type": "other", "task_id": "same"})
    assert r.status_code == 409
    error = r.json()["error"]
    assert (error["code"], error["field"]) == ("task_id_conflict", "task_id")
    assert error["message"].startswith("task ID conflicts with another task")
    r = await api.post(TASKS, json={**BASE, "unique": 60})
    assert r.status_code == 201
    r = await api.post(TASKS, json={**BASE, "unique": 60, "process_in": "10m"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "duplicate_task"
    assert r.json()["error"]["field"] == "unique"


async def test_get_missing_task_and_queue_is_404(api: httpx.AsyncClient) -> None:
    r = await api.get("/api/queues/never-used/tasks/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "queue_not_found"
    assert r.json()["error"]["field"] == "queue"
    await api.post(TASKS, json=BASE)
    r = await api.get(f"{TASKS}/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "task_not_found"
    assert r.json()["error"]["field"] == "task_id"
    r = await api.get("/api/nowhere")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await api.delete(f"{TASKS}/x")
    assert r.status_code == 405


async def test_batch(api: httpx.AsyncClient, redis: Redis) -> None:
    r = await api.post(
        f"{TASKS}/batch",
        json={
            "tasks": [
                {**BASE, "task_id": "b1"},
                {"type": "", "payload": 1},
                {**BASE, "task_id": "b1"},
                {"type": "x", "unique": "1m", "process_at": "2100-01-01T00:00:00Z"},
                {"type": "x", "unique": "1m", "process_at": "2100-01-01T00:00:00Z"},
            ]
        },
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == [201, 400, 409, 201, 409]
    assert results[0]["task"]["id"] == "b1" and results[0]["error"] is None
    assert results[1]["error"]["field"] == "tasks.1.type" and results[1]["task"] is None
    assert results[2]["error"]["code"] == "task_id_conflict"
    assert results[3]["task"]["state"] == "scheduled"
    assert results[4]["error"]["code"] == "duplicate_task"
    assert len(await redis.keys("asynq:*:t:*")) == 2

    r = await api.post(f"{TASKS}/batch", json={"tasks": [BASE] * (MAX_BATCH + 1)})
    assert r.status_code == 413 and r.json()["error"]["field"] == "tasks"
    r = await api.post(f"{TASKS}/batch", json={"tasks": []})
    assert r.status_code == 400 and r.json()["error"]["field"] == "tasks"
    r = await api.post(f"{TASKS}/batch", json={"tasks": "no"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "tasks"
    r = await api.post(f"{TASKS}/batch", json=[BASE])
    assert r.status_code == 400
    r = await api.post(f"{TASKS}/batch", json={"tasks": ["not an object"]})
    assert r.json()["results"][0]["status"] == 400
    assert len(await redis.keys("asynq:*:t:*")) == 2


async def test_openapi_and_health(api: httpx.AsyncClient) -> None:
    r = await api.get("/api/openapi.json", headers={"Authorization": ""})
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) >= {
        "/api/queues/{queue}/tasks",
        "/api/queues/{queue}/tasks/batch",
        "/api/queues/{queue}/tasks/{task_id}",
    }
    props = doc["components"]["schemas"]["EnqueueRequest"]["properties"]
    assert set(props) == {
        "type",
        "payload",
        "payload_encoding",
        "task_id",
        "max_retry",
        "timeout",
        "deadline",
        "process_at",
        "process_in",
        "unique",
        "retention",
        "group",
        "headers",
    }

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [node["$ref"]] if "$ref" in node else []
            return found + [r for v in node.values() for r in refs(v)]
        if isinstance(node, list):
            return [r for v in node for r in refs(v)]
        return []

    for ref in refs(doc):
        name = ref.removeprefix("#/components/schemas/")
        assert name in doc["components"]["schemas"], ref
    r = await api.get("/api/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


async def test_redis_unreachable_is_503() -> None:
    # The enqueue retries a refused connection until its deadline (5 s by default) before
    # the 503; a short one answers the same sooner. The default, built from a URI, is
    # test_redis_unreachable_is_503_from_the_server's.
    gone = Client(
        f"redis://127.0.0.1:{free_port()}/0", retry=RetryPolicy(deadline=timedelta(seconds=0.2))
    )
    app = create_app(gone)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        for method, path, body in [
            ("POST", TASKS, BASE),
            ("POST", f"{TASKS}/batch", {"tasks": [BASE]}),
            ("GET", f"{TASKS}/x", None),
            ("GET", "/api/health", None),
        ]:
            r = await c.request(method, path, json=body)
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"]["code"] == "redis_unavailable"
            assert r.headers["retry-after"] == "1"
    await app.state.gateway.aclose()
    await gone.aclose()


def test_redis_unreachable_is_503_from_the_server() -> None:
    with gateway_process(f"redis://127.0.0.1:{free_port()}/0") as (base, proc):
        r = httpx.post(base + TASKS, json=BASE, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "redis_unavailable"
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err


async def test_no_token_serves_loopback_only(redis: Redis, redis_url: str) -> None:
    app = create_app(redis_url)
    for host, status in [("127.0.0.1", 201), ("::1", 201), ("10.0.0.7", 401), ("192.0.2.1", 401)]:
        transport = httpx.ASGITransport(app=app, client=(host, 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            r = await c.post(TASKS, json=BASE)
        assert r.status_code == status, (host, r.text)
    # With a token, a remote client that sends it is served.
    app2 = create_app(redis_url, token=TOKEN)
    transport = httpx.ASGITransport(app=app2, client=("10.0.0.7", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
        assert (await c.post(TASKS, json=BASE)).status_code == 401
        assert (await c.post(TASKS, json=BASE, headers=AUTH)).status_code == 201
    await app.state.gateway.aclose()
    await app2.state.gateway.aclose()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::"])
def test_cli_refuses_a_public_bind_without_token(redis_url: str, host: str) -> None:
    result = CliRunner().invoke(main, ["-u", redis_url, "gateway", "--host", host])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: refusing to serve {host} without a token")


def test_cli_rejects_an_empty_token(redis_url: str) -> None:
    result = CliRunner(env={"ASYNCQ_GATEWAY_TOKEN": "  "}).invoke(
        main, ["-u", redis_url, "gateway"]
    )
    assert result.exit_code == 1 and "token is empty" in result.stderr


def test_create_app_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="token cannot be empty"):
        create_app("redis://localhost", token="")
    with pytest.raises(ValueError, match="max_body_bytes"):
        create_app("redis://localhost", max_body_bytes=0)
    with pytest.raises(ValueError, match="max_batch"):
        create_app("redis://localhost", max_batch=0)


async def test_mounted_under_a_prefix_with_a_shared_client(redis: Redis) -> None:
    async with Client(redis) as client:
        gateway = create_app(client, token=TOKEN)
        outer = Starlette(routes=[Mount("/gw", app=gateway)])
        transport = httpx.ASGITransport(app=outer, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://web", headers=AUTH) as c:
            r = await c.post(f"/gw{TASKS}", json=BASE)
            assert r.status_code == 201, r.text
            got = await c.get(f"/gw{TASKS}/{r.json()['id']}")
            assert got.status_code == 200
            doc = (await c.get("/gw/api/openapi.json")).json()
            assert doc["servers"] == [{"url": "/gw"}]
        await gateway.state.gateway.aclose()
        await client.ping()  # a shared Client stays open


async def test_payloads_stay_out_of_the_logs(redis: Redis, redis_url: str) -> None:
    app = create_app(redis_url, token=TOKEN)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    secret = "card-4111111111111111"
    with structlog.testing.capture_logs() as logs:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", headers=AUTH
        ) as c:
            await c.post(TASKS, json={"type": "pay", "payload": {"card": secret}})
            await c.post(f"{TASKS}/batch", json={"tasks": [{"type": "pay", "payload": secret}]})
            await c.post(TASKS, json={"type": "pay", "payload": secret, "timeout": "x"})
    await app.state.gateway.aclose()
    events = [e["event"] for e in logs]
    assert events.count("task enqueued over HTTP") == 1
    assert events.count("batch enqueued over HTTP") == 1
    assert secret not in json.dumps(logs, default=str)
    assert TOKEN not in json.dumps(logs, default=str)


@pytest.mark.parametrize(
    "args",
    [
        ["gateway"],
        ["worker", "--http-target", "php:*=http://a/b", "--http-target-secret", "s"],
    ],
)
def test_missing_extra_names_the_install_command(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    result = CliRunner().invoke(main, ["-u", redis_url, *args])
    assert result.exit_code == 1
    assert "needs uvicorn: pip install 'asyncq[gateway]'" in result.stderr
