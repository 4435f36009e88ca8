"""Hostile names in the web UI and the gateway: path segments that hold ``/`` or ``..``
(issue 25 item 5) and Host headers a DNS-rebinding page sends (item 6)."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from urllib.parse import urljoin

import httpx
import pytest
from redis.asyncio import Redis

from asyncq import Client, Inspector, Task
from asyncq._http import quote_segment
from asyncq.gateway import create_app as create_gateway
from asyncq.web import create_app
from tests.support.redis_server import free_port

H = {"X-Asyncq-Request": "1"}
BASE = "http://127.0.0.1"

_SINGLE = {".", "%2e"}
_DOUBLE = {"..", ".%2e", "%2e.", "%2e%2e"}


def browser_url(base: str, relative: str) -> str:
    """Resolve *relative* against *base* and drop dot segments as a browser does: the
    WHATWG URL parser also treats ``%2e`` forms of ``.`` and ``..`` as dot segments."""
    joined = urljoin(base, relative)
    scheme_host, _, rest = joined.partition("://")
    host, _, path = rest.partition("/")
    path, q, query = path.partition("?")
    out: list[str] = []
    for seg in path.split("/"):
        low = seg.lower()
        if low in _SINGLE:
            continue
        if low in _DOUBLE:
            if out:
                out.pop()
            continue
        out.append(seg)
    return f"{scheme_host}://{host}/{'/'.join(out)}{q}{query}"


def api_calls(page: str) -> list[tuple[str, str]]:
    """The (method, path) of every action button on a page, as app.js sends it."""
    return [
        tuple(html.unescape(m).split(" ", 1))  # type: ignore[misc]
        for m in re.findall(r'data-api="([^"]+)"', page)
    ]


def links(page: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(r'href="([^"]+)"', page)]


@pytest.fixture
async def web(redis_url: str, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as h,
    ):
        yield h


HOSTILE_IDS = [
    "../../victimq/tasks/victim1",
    "a/b",
    "..",
    ".",
    "%2e%2e",
    "x?y#z",
    "50% off",
    "~..",
    "sp ace/..",
]


async def _row_action(web: httpx.AsyncClient, queue: str, task_id: str, action: str) -> str:
    page = (await web.get(f"/queues/{queue}?state=pending")).text
    calls = [p for m, p in api_calls(page) if m == "POST" and p.endswith(f"/{action}")]
    mine = [p for p in calls if "/tasks/" in p]
    assert mine, page
    return browser_url(f"{BASE}/", "api/" + mine[0])


async def test_row_delete_with_dots_in_the_id_deletes_only_that_task(
    web: httpx.AsyncClient, redis: Redis
) -> None:
    async with Client(redis) as client:
        await client.enqueue(Task("t", b"victim"), queue="victimq", task_id="victim1")
        await client.enqueue(Task("t", b"hostile"), queue="default", task_id=HOSTILE_IDS[0])
    url = await _row_action(web, "default", HOSTILE_IDS[0], "delete")
    r = await web.post(url, headers=H)
    assert r.status_code == 200, (url, r.text)
    async with Inspector(redis) as insp:
        assert (await insp.get_task("victimq", "victim1")).id == "victim1"
        assert (await insp.queue_info("default")).pending == 0


@pytest.mark.parametrize("task_id", HOSTILE_IDS)
async def test_every_link_and_action_addresses_the_right_task(
    web: httpx.AsyncClient, redis: Redis, task_id: str
) -> None:
    queue = "ten/ant:.."
    async with Client(redis) as client:
        await client.enqueue(Task("t", b"mine"), queue=queue, task_id=task_id)
        # Decoys wherever a misrouted URL could land.
        await client.enqueue(Task("t", b"decoy"), queue="ten", task_id="decoy")
        await client.enqueue(Task("t", b"decoy"), queue="default", task_id="decoy")
    dash = (await web.get("/")).text
    # Each queue is linked from the size chart and from the table: three distinct targets.
    queue_links = sorted({u for u in links(dash) if "/queues/" in u})
    assert len(queue_links) == 3, queue_links
    for href in queue_links:
        r = await web.get(browser_url(f"{BASE}/", href))
        assert r.status_code == 200, (href, r.text[:300])
    mine = re.findall(r'<a href="([^"]+)">' + re.escape(html.escape(queue)) + "</a>", dash)
    assert len(mine) == 1, dash
    page = (await web.get(browser_url(f"{BASE}/", html.unescape(mine[0])) + "?state=pending")).text
    task_links = [u for u in links(page) if "/tasks/" in u]
    assert len(task_links) == 1, task_links
    detail = await web.get(browser_url(f"{BASE}/", task_links[0]))
    assert detail.status_code == 200, (task_links[0], detail.text[:300])
    assert html.escape(task_id) in detail.text
    api = browser_url(
        f"{BASE}/", "api/" + next(p for m, p in api_calls(detail.text) if p.endswith("/archive"))
    )
    assert (await web.post(api, headers=H)).status_code == 200, api
    async with Inspector(redis) as insp:
        assert (await insp.get_task(queue, task_id)).state.value == "archived"
        assert (await insp.get_task("ten", "decoy")).state.value == "pending"
        assert (await insp.get_task("default", "decoy")).state.value == "pending"
    # The JSON API reads it by its encoded segments too.
    got = await web.get(
        browser_url(f"{BASE}/", "api/" + api.split("/api/", 1)[1].rsplit("/", 1)[0])
    )
    assert got.status_code == 200 and got.json()["task"]["id"] == task_id


async def test_search_redirect_encodes_the_id(web: httpx.AsyncClient, redis: Redis) -> None:
    async with Client(redis) as client:
        await client.enqueue(Task("t", b"x"), queue="q/1", task_id="a/../b")
    r = await web.get("/search", params={"id": "a/../b"})
    assert r.status_code == 303
    target = await web.get(browser_url(f"{BASE}/", r.headers["location"]))
    assert target.status_code == 200 and "a/../b" in html.unescape(target.text)


# Item 6: a page on another site that rebinds its DNS name to 127.0.0.1 sends its own name
# in Host; a gateway without a token must refuse it as the web UI does.
@pytest.mark.parametrize("client_ip", ["127.0.0.1", "127.0.0.2", "::1"])
async def test_gateway_without_token_refuses_a_foreign_host(
    redis_url: str, redis: Redis, client_ip: str
) -> None:
    app = create_gateway(redis_url)
    transport = httpx.ASGITransport(app=app, client=(client_ip, 50000))
    body = {"type": "t", "payload": 1, "task_id": "rebound"}
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as c:
        for host in [
            "attacker.example",
            "attacker.example:8080",
            "localhost.attacker.example",
            "127.0.0.2:1",  # another loopback address is not this gateway (the web UI's rule)
        ]:
            r = await c.post("/api/queues/default/tasks", json=body, headers={"Host": host})
            assert r.status_code == 400, (host, r.text)
            assert r.json()["error"]["code"] == "invalid_host"
            assert "Host" in r.json()["error"]["message"]
            assert (await c.get("/api/health", headers={"Host": host})).status_code == 400
        assert await redis.exists("asynq:{default}:t:rebound") == 0
        for host in ["localhost:8080", "127.0.0.1", "[::1]:8080", "LOCALHOST"]:
            r = await c.get("/api/health", headers={"Host": host})
            assert r.status_code == 200, (host, r.text)
    await app.state.gateway.aclose()


async def test_gateway_reads_ids_with_slashes_and_dots(redis_url: str, redis: Redis) -> None:
    app = create_gateway(redis_url)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        for queue, task_id in [("q/1", "a/../b"), ("..", ".."), ("q", "50%/x")]:
            r = await c.post(
                f"/api/queues/{quote_segment(queue)}/tasks", json={"type": "t", "task_id": task_id}
            )
            assert r.status_code == 201, r.text
            assert r.json()["queue"] == queue and r.json()["id"] == task_id
            got = await c.get(f"/api/queues/{quote_segment(queue)}/tasks/{quote_segment(task_id)}")
            assert got.status_code == 200, got.text
            assert got.json()["id"] == task_id and got.json()["queue"] == queue
    await app.state.gateway.aclose()


def test_web_command_on_any_loopback_address_checks_host(redis_url: str) -> None:
    port = free_port()
    base = f"http://127.0.0.2:{port}"
    cmd = [sys.executable, "-m", "asyncq.cli", "--uri", redis_url, "web", "--host", "127.0.0.2"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # It prints its address once it listens (a request then waits in the backlog).
        assert proc.stdout is not None
        said = ""
        while "asyncq web on " not in said:
            line = proc.stdout.readline()
            assert line, f"web did not start: {said}"  # end of file: it exited
            said += line
        assert f"asyncq web on {base}/" in said, said
        local = httpx.get(base + "/static/app.css", timeout=30)  # a hang guard: start-up
        assert local.status_code == 200
        rebound = httpx.get(base + "/api/queues", headers={"Host": f"attacker.example:{port}"})
        assert rebound.status_code == 400
        assert (
            httpx.get(base + "/api/queues", headers={"Host": f"localhost:{port}"}).status_code
            == 200
        )
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
