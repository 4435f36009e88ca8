"""One Host rule for the loopback-only web UI and the gateway without a token (issue 39
item 5): the names of this server pass, any other name or loopback address does not."""

from __future__ import annotations

import httpx
import pytest
from redis.asyncio import Redis

from asyncq._http import LoopbackHosts, loopback_host_problem
from asyncq.gateway import create_app as create_gateway
from asyncq.web import create_app as create_web

# Requests arrive on 127.0.0.1:8080 (the base URL below gives the ASGI scope's server).
PASS = [
    "localhost:8080",
    "LOCALHOST",
    "localhost.",
    "127.0.0.1",
    "127.0.0.1:1",
    "[::1]:8080",
    "[::1]",
]
REFUSE = [
    "127.0.0.2",
    "127.0.0.2:8080",
    "127.1",
    "attacker.example",
    "localhost.attacker.example",
    "[::2]:8080",
    "localhost:http",
    "[::1",
    "",
]


def test_the_rule() -> None:
    for header in PASS:
        assert loopback_host_problem(header, "127.0.0.1") is None, header
    for header in REFUSE:
        problem = loopback_host_problem(header, "127.0.0.1")
        assert problem is not None and problem.startswith(f"Host header {header!r} "), header
    # The address the server listens on is its name too, in any spelling of it.
    assert loopback_host_problem("127.0.0.2:80", "127.0.0.2") is None
    assert loopback_host_problem("[0:0:0:0:0:0:0:1]", "::1") is None
    assert loopback_host_problem(None, None) == (
        "Host header None does not name this server (localhost, 127.0.0.1, ::1, with any port)"
    )


@pytest.mark.parametrize("app_kind", ["web", "gateway"])
async def test_web_ui_and_gateway_answer_the_same(
    app_kind: str, redis_url: str, redis: Redis
) -> None:
    if app_kind == "web":
        app = create_web(redis_url)
        # What `asyncq web` adds when it listens on a loopback address.
        app.add_middleware(LoopbackHosts)
        path = "/api/queues"
    else:
        app = create_gateway(redis_url)
        path = "/api/health"
    transport = httpx.ASGITransport(app=app, client=("127.0.0.2", 50000))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as c,
    ):
        for header in PASS:
            r = await c.get(path, headers={"Host": header})
            assert r.status_code == 200, (header, r.text)
        for header in REFUSE:
            r = await c.get(path, headers={"Host": header})
            assert r.status_code == 400, (header, r.text)
            assert f"Host header {header!r} does not name this server" in r.text, r.text
