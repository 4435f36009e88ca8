"""HTTP-target tasks against a real local HTTP server (uvicorn in the test's event loop).

The target checks every request's signature with its own HMAC code (not
asyncq's) and answers as each test needs: success with a result, a failure
then success, skip-retry, slowness (timeout, cancellation mid-request).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from asyncq import Client, Inspector, ServeMux, Server, Task, TaskState
from asyncq.cli import main
from asyncq.gateway import (
    HTTPTarget,
    HTTPTargetError,
    SignatureError,
    add_http_targets,
    create_app,
    parse_http_target,
    sign,
    verify_signature,
)
from tests.support.gateway_util import cli_env, serve_in_loop
from tests.support.procs import FAST, wait_until

SECRET = "shared-secret-for-tests"


@dataclass
class Seen:
    headers: dict[str, str]
    body: bytes
    signature_ok: bool


@dataclass
class Target:
    """The test HTTP server's record of what it received."""

    url: str = ""
    secret: bytes = SECRET.encode()
    requests: list[Seen] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)

    def check(self, headers: dict[str, str], body: bytes) -> bool:
        ts = headers.get("asyncq-timestamp", "")
        want = "v1=" + hmac.new(self.secret, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        fresh = ts.isdigit() and abs(time.time() - int(ts)) < 300
        return fresh and hmac.compare_digest(want, headers.get("asyncq-signature", ""))


def target_app(t: Target) -> Starlette:
    async def endpoint(request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        ok = t.check(headers, body)
        t.requests.append(Seen(headers, body, ok))
        name = request.path_params["name"]
        n = t.calls[name] = t.calls.get(name, 0) + 1
        if not ok:
            return Response("bad signature", status_code=401)
        if name == "ok":
            return Response(
                json.dumps({"handled": json.loads(body)}), media_type="application/json"
            )
        if name == "empty":
            return Response(status_code=204)
        if name == "text":
            return Response("done: plain text")
        if name == "flaky":
            if n == 1:
                return Response("database is down\n" + "x" * 1000, status_code=503)
            return Response("second time lucky")
        if name == "skip":
            return Response(
                "unknown customer", status_code=422, headers={"Asyncq-Skip-Retry": "true"}
            )
        if name == "notfound":
            return Response("no such route", status_code=404)
        if name == "big":
            return Response(b"z" * 5000)
        if name == "redirect":
            return Response(status_code=302, headers={"Location": "/ok"})
        if name == "slow":
            t.started.set()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if await request.is_disconnected():
                    t.disconnected.set()
                    return Response("client went away", status_code=499)
                await asyncio.sleep(0.02)
            return Response("too late")
        return Response("unknown test route", status_code=500)

    return Starlette(routes=[Route("/{name}", endpoint, methods=["POST"])])


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    t = Target()
    async with serve_in_loop(target_app(t)) as url:
        t.url = url
        yield t


def retry_now(n: int, exc: BaseException, task: Task) -> timedelta:
    return timedelta(0)


def retry_later(n: int, exc: BaseException, task: Task) -> timedelta:
    return timedelta(hours=1)


async def run_one(
    redis: Redis,
    mux: ServeMux,
    task: Task,
    *,
    until: set[TaskState],
    retry_delay: Any = retry_later,
    **options: Any,
) -> Any:
    """Enqueue *task*, serve *mux* until it reaches one of *until*; return its TaskInfo."""
    async with Client(redis) as client, Inspector(redis) as insp:
        info = await client.enqueue(task, retention=timedelta(hours=1), **options)
        async with Server(redis, concurrency=2, retry_delay=retry_delay, **FAST) as server:
            await server.start(mux)

            async def reached() -> Any:
                got = await insp.get_task(info.queue, info.id)
                return got if got.state in until else None

            return await wait_until(reached, within=30, what=f"task in {until}")


def mux_for(url: str, **options: Any) -> ServeMux:
    mux = ServeMux()
    add_http_targets(mux, {"php:*": url}, secret=SECRET, **options)
    return mux


async def test_success_stores_the_body_as_result(redis: Redis, target: Target) -> None:
    info = await run_one(
        redis,
        mux_for(f"{target.url}/ok"),
        Task.from_json("php:invoice", {"n": 7}, headers={"tenant": "acme"}),
        until={TaskState.COMPLETED},
        max_retry=4,
        timeout=timedelta(minutes=2),
    )
    assert json.loads(info.result or b"") == {"handled": {"n": 7}}
    (seen,) = target.requests
    assert seen.signature_ok
    assert seen.body == b'{"n":7}'
    h = seen.headers
    assert h["asyncq-task-id"] == info.id
    assert h["asyncq-task-type"] == "php:invoice"
    assert h["asyncq-task-queue"] == "default"
    assert (h["asyncq-retry-count"], h["asyncq-max-retry"]) == ("0", "4")
    assert 0 < float(h["asyncq-deadline"]) - time.time() <= 120
    assert json.loads(h["asyncq-task-headers"]) == {"tenant": "acme"}
    assert h["content-type"] == "application/octet-stream"
    assert h["user-agent"].startswith("asyncq/")


@pytest.mark.parametrize(("route", "result"), [("empty", None), ("text", b"done: plain text")])
async def test_other_2xx_answers(redis: Redis, target: Target, route: str, result: Any) -> None:
    info = await run_one(
        redis, mux_for(f"{target.url}/{route}"), Task("php:x"), until={TaskState.COMPLETED}
    )
    assert info.result == result
    assert target.requests[0].body == b"" and target.requests[0].signature_ok


async def test_failure_then_retry_succeeds(redis: Redis, target: Target) -> None:
    info = await run_one(
        redis,
        mux_for(f"{target.url}/flaky"),
        Task("php:flaky", b"payload"),
        until={TaskState.COMPLETED},
        retry_delay=retry_now,
    )
    assert target.calls["flaky"] == 2
    assert info.retried == 1
    assert info.result == b"second time lucky"
    # The first attempt's error names the status and starts the body, cut short.
    assert info.last_error.startswith(
        f"HTTP target {target.url}/flaky answered 503 Service Unavailable: database is down x"
    )
    assert len(info.last_error) < 400
    assert [r.headers["asyncq-retry-count"] for r in target.requests] == ["0", "1"]


@pytest.mark.parametrize(
    ("route", "status"), [("notfound", "404 Not Found"), ("redirect", "302 Found")]
)
async def test_other_statuses_fail_the_attempt(
    redis: Redis, target: Target, route: str, status: str
) -> None:
    info = await run_one(
        redis, mux_for(f"{target.url}/{route}"), Task("php:x"), until={TaskState.RETRY}
    )
    assert info.retried == 1
    assert info.last_error.startswith(f"HTTP target {target.url}/{route} answered {status}")


async def test_skip_retry_marker_archives_at_once(redis: Redis, target: Target) -> None:
    info = await run_one(
        redis,
        mux_for(f"{target.url}/skip"),
        Task("php:x"),
        until={TaskState.ARCHIVED},
        max_retry=10,
    )
    assert target.calls["skip"] == 1
    assert info.retried == 0
    assert "answered 422 Unprocessable" in info.last_error
    assert "unknown customer" in info.last_error


async def test_too_big_a_result_fails(redis: Redis, target: Target) -> None:
    info = await run_one(
        redis,
        mux_for(f"{target.url}/big", max_result_bytes=4096),
        Task("php:x"),
        until={TaskState.RETRY},
    )
    assert "over max_result_bytes (4096 bytes)" in info.last_error
    assert info.result is None


async def test_task_timeout_bounds_the_request(redis: Redis, target: Target) -> None:
    started = time.monotonic()
    info = await run_one(
        redis,
        mux_for(f"{target.url}/slow"),
        Task("php:slow"),
        until={TaskState.RETRY},
        timeout=timedelta(seconds=1),
    )
    assert time.monotonic() - started < 25  # far less than the target's 30 s
    await asyncio.wait_for(target.disconnected.wait(), 10)
    assert info.last_error == "context deadline exceeded"


async def test_target_timeout_option(redis: Redis, target: Target) -> None:
    info = await run_one(
        redis,
        mux_for(f"{target.url}/slow", timeout=timedelta(milliseconds=300)),
        Task("php:slow"),
        until={TaskState.RETRY},
    )
    assert info.last_error.startswith(f"HTTP target {target.url}/slow did not answer within 0.300s")
    await asyncio.wait_for(target.disconnected.wait(), 10)


async def test_cancellation_aborts_the_request(redis: Redis, target: Target) -> None:
    async with Client(redis) as client, Inspector(redis) as insp:
        info = await client.enqueue(Task("php:slow"), retention=timedelta(hours=1))
        async with Server(redis, concurrency=1, retry_delay=retry_later, **FAST) as server:
            await server.start(mux_for(f"{target.url}/slow"))
            await asyncio.wait_for(target.started.wait(), 20)
            await insp.cancel(info.id)
            await asyncio.wait_for(target.disconnected.wait(), 10)

            async def retried() -> Any:
                got = await insp.get_task("default", info.id)
                return got if got.state is TaskState.RETRY else None

            got = await wait_until(retried, within=20, what="the cancelled task in retry")
    assert "cancel" in got.last_error.lower()
    assert target.calls["slow"] == 1


async def test_signature_is_verified_by_the_target(redis: Redis, target: Target) -> None:
    target.secret = b"the target expects another secret"
    info = await run_one(
        redis, mux_for(f"{target.url}/ok"), Task("php:x", b"{}"), until={TaskState.RETRY}
    )
    assert not target.requests[0].signature_ok
    assert "answered 401 Unauthorized: bad signature" in info.last_error


async def test_unreachable_target_fails_the_attempt(redis: Redis) -> None:
    from tests.support.redis_server import free_port

    url = f"http://127.0.0.1:{free_port()}/tasks"
    info = await run_one(redis, mux_for(url), Task("php:x"), until={TaskState.RETRY})
    assert info.last_error.startswith(f"cannot reach HTTP target {url}: ConnectError")


def test_verify_signature() -> None:
    body = b'{"n":1}'
    now = 1_800_000_000
    good = sign(SECRET, now, body)
    assert good == "v1=" + hmac.new(SECRET.encode(), b"1800000000." + body, "sha256").hexdigest()
    verify_signature(SECRET, timestamp=str(now), signature=good, body=body, now=now + 10)
    bad_cases = [
        ({"timestamp": None, "signature": good, "body": body}, "missing Asyncq-Timestamp"),
        ({"timestamp": str(now), "signature": None, "body": body}, "missing Asyncq-Signature"),
        ({"timestamp": "soon", "signature": good, "body": body}, "not unix seconds"),
        ({"timestamp": str(now), "signature": good, "body": b'{"n":2}'}, "does not match"),
        ({"timestamp": str(now + 1), "signature": good, "body": body}, "does not match"),
        ({"timestamp": str(now - 3600), "signature": good, "body": body}, "away from now"),
    ]
    for kwargs, needle in bad_cases:
        with pytest.raises(SignatureError, match=needle):
            verify_signature(SECRET, now=now, **kwargs)
    with pytest.raises(SignatureError, match="does not match"):
        verify_signature("other", timestamp=str(now), signature=good, body=body, now=now)


def test_bad_target_configuration() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        HTTPTarget("ftp://host/x", secret=SECRET)
    with pytest.raises(ValueError, match="http:// or https://"):
        HTTPTarget("not a url", secret=SECRET)
    with pytest.raises(ValueError, match="non-empty signing secret"):
        HTTPTarget("http://host/x", secret="")
    with pytest.raises(ValueError, match="timeout must be positive"):
        HTTPTarget("http://host/x", secret=SECRET, timeout=timedelta(0))
    with pytest.raises(ValueError, match="'\\*' may only end it"):
        add_http_targets(ServeMux(), {"php:*:x": "http://host/x"}, secret=SECRET)
    with pytest.raises(ValueError, match="would match every task"):
        add_http_targets(ServeMux(), {"*": "http://host/x"}, secret=SECRET)
    assert parse_http_target(" php:* = http://a/b ") == ("php:*", "http://a/b")
    for bad in ("php:*", "=http://a", "php:*="):
        with pytest.raises(ValueError, match="expected PATTERN=URL"):
            parse_http_target(bad)
    # Credentials in a target URL stay out of errors and reprs.
    assert "pw" not in repr(HTTPTarget("http://user:pw@host:81/x", secret=SECRET))


def test_worker_http_target_arguments(redis_url: str) -> None:
    runner = CliRunner(env={"ASYNCQ_HTTP_TARGET_SECRET": ""})
    cases = [
        ([], "give MODULE:APP, --http-target PATTERN=URL, or both"),
        (["--http-target", "php:*=http://a/b"], "--http-target needs --http-target-secret"),
        (["--http-target", "php", "--http-target-secret", "s"], "expected PATTERN=URL"),
        (
            ["--http-target", "php:*=ftp://a/b", "--http-target-secret", "s"],
            "must be http:// or https://",
        ),
    ]
    for args, needle in cases:
        result = runner.invoke(main, ["-u", redis_url, "worker", *args])
        assert result.exit_code != 0
        assert needle in result.stderr, (args, result.stderr)


async def test_worker_command_end_to_end(redis: Redis, redis_url: str, target: Target) -> None:
    """curl-style producer -> gateway -> ``asyncq worker --http-target`` -> the HTTP target."""
    app = create_app(redis_url)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as gw:
        r = await gw.post(
            "/api/queues/default/tasks",
            json={"type": "php:invoice", "payload": {"n": 3}, "retention": "1h"},
        )
        assert r.status_code == 201
        task_id = r.json()["id"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "asyncq.cli",
            "-u",
            redis_url,
            "worker",
            "--burst",
            "--http-target",
            f"php:*={target.url}/ok",
            env=cli_env(ASYNCQ_HTTP_TARGET_SECRET=SECRET),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        got = (await gw.get(f"/api/queues/default/tasks/{task_id}")).json()
    await app.state.gateway.aclose()
    assert got["state"] == "completed"
    assert got["result"] == {"handled": {"n": 3}}
    assert target.requests[0].signature_ok
    assert SECRET not in err.decode()


async def test_target_with_a_shared_client_outside_a_server() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/slow":
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, content=b"ok")

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        target = HTTPTarget("http://app/tasks", secret=SECRET, client=http)
        await target(Task("php:x", b"p"))  # no result writer outside a server: nothing stored
        slow = HTTPTarget("http://app/slow", secret=SECRET, client=http)
        with pytest.raises(HTTPTargetError, match=r"^HTTP target http://app/slow did not answer "):
            await slow(Task("php:x", b"p"))
        await target.aclose()
        assert not http.is_closed  # a client passed in stays open
    first = seen[0]
    ts = int(first.headers["asyncq-timestamp"])
    assert first.headers["asyncq-signature"] == sign(SECRET, ts, b"p")
    assert "asyncq-deadline" not in first.headers  # no running task, no deadline
    assert first.headers["asyncq-retry-count"] == "0"
