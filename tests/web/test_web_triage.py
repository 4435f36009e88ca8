"""The failure triage page and JSON API through the ASGI app (httpx), on a fixture of mixed
failures (tests/inspection/test_triage.py's): exact counts, the scan cap, the actions per group."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from redis.asyncio import Redis

from asyncq.web import create_app
from tests.support.triage import CONN, DIAL, KEYERR, VALUE, seed_mixed

H = {"X-Asyncq-Request": "1"}


@pytest.fixture
async def http(redis_url: str, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    await seed_mixed(redis)
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as h,
    ):
        yield h


async def test_api_groups_with_exact_counts(http: httpx.AsyncClient) -> None:
    data = (await http.get("/api/errors")).json()
    assert (data["scanned"], data["total"], data["capped"]) == (20, 20, False)
    counts = {g["key"]: g["count"] for g in data["groups"]}
    assert counts == {
        CONN.key: 9,
        KEYERR.key: 5,
        DIAL.key: 3,
        VALUE.key: 2,
        **{g["key"]: 1 for g in data["groups"] if g["message"] == "undecodable task message"},
    }
    conn = data["groups"][0]
    assert conn["signature"] == str(CONN)
    assert conn["queues"] == {"default": 7, "critical": 2}
    assert conn["states"] == {"archived": 6, "retry": 3}
    assert conn["sample"][0]["queue"] == "default" and len(conn["sample"]) == 5
    critical = (await http.get("/api/errors?queue=critical&state=archived")).json()
    assert {g["key"]: g["count"] for g in critical["groups"]} == {CONN.key: 2, DIAL.key: 3}
    capped = (await http.get("/api/errors?limit=4")).json()
    assert (capped["scanned"], capped["total"], capped["capped"]) == (4, 20, True)


async def test_api_bad_requests(http: httpx.AsyncClient) -> None:
    bad_state = await http.get("/api/errors?state=pending")
    assert (
        bad_state.status_code == 400 and "retry or archived" in bad_state.json()["error"]["message"]
    )
    assert (await http.get("/api/errors?queue=nope")).status_code == 404
    assert (await http.get("/api/errors?limit=0")).status_code == 400
    assert (await http.post(f"/api/errors/{CONN.key}/explode", headers=H)).status_code == 404
    assert (await http.post(f"/api/errors/{CONN.key}/run")).status_code == 403  # no CSRF header
    bad_key = await http.post("/api/errors/not-a-key/run", headers=H)
    assert bad_key.status_code == 400 and "12 hex digits" in bad_key.json()["error"]["message"]


async def test_api_actions_per_group(http: httpx.AsyncClient, redis: Redis) -> None:
    resp = await http.post(f"/api/errors/{CONN.key}/delete?queue=critical", headers=H)
    assert resp.json() == {"count": 2, "acted": 2, "skipped": 0}
    resp = await http.post(f"/api/errors/{CONN.key}/archive", headers=H)
    assert resp.json() == {"count": 3, "acted": 3, "skipped": 0}
    assert await redis.zcard("asynq:{default}:retry") == 2
    resp = await http.post(f"/api/errors/{CONN.key}/run?state=archived", headers=H)
    assert resp.json()["acted"] == 7
    assert await redis.llen("asynq:{default}:pending") == 1 + 7
    resp = await http.post(f"/api/errors/{KEYERR.key}/run?state=retry", headers=H)
    assert resp.json()["acted"] == 0  # its tasks are all archived
    data = (await http.get("/api/errors")).json()
    assert {g["key"]: g["count"] for g in data["groups"]}.get(CONN.key) is None
    assert data["total"] == 11


async def test_page_shows_groups_and_the_cap(http: httpx.AsyncClient) -> None:
    page = await http.get("/errors")
    assert page.status_code == 200
    html = page.text
    assert "5</b> error groups" in html and "20</b> failed tasks" in html
    assert "scanned 20" not in html and "capped" not in html
    for key in (CONN.key, KEYERR.key, DIAL.key, VALUE.key):
        assert f'data-key="{key}"' in html
        assert f'data-api="POST errors/{key}/run?"' in html
    # The escaped signature, the newest error as stored, links to the queues and tasks.
    assert "Error &lt;n&gt; connecting to &lt;ip&gt;. Connection refused." in html
    assert "KeyError" in html and "&#39;&lt;str&gt;&#39;" in html
    assert 'href="/queues/critical?state=archived"' in html
    assert re.search(r'href="/queues/default/tasks/[0-9a-f-]{36}"', html)
    capped = (await http.get("/errors?limit=4&queue=default")).text
    assert "scanned 4 of 15" in capped
    assert 'href="/errors?queue=default&amp;limit=15"' in capped
    assert f'data-api="POST errors/{CONN.key}/delete?queue=default"' in capped
    retry = (await http.get("/errors?state=retry")).text
    assert f'data-api="POST errors/{CONN.key}/archive?state=retry"' in retry
    empty = (await http.get("/errors?queue=low")).status_code
    assert empty == 404  # no such queue


async def test_read_only_page_has_no_actions(redis_url: str, redis: Redis) -> None:
    await seed_mixed(redis)
    app = create_app(redis_url, read_only=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as h,
    ):
        html = (await h.get("/errors")).text
        assert f'data-key="{CONN.key}"' in html and "data-api" not in html
        resp = await h.post(f"/api/errors/{CONN.key}/delete", headers=H)
        assert resp.status_code == 405
    assert await redis.zcard("asynq:{critical}:archived") == 5


async def test_queue_tabs_link_to_their_error_groups(http: httpx.AsyncClient) -> None:
    archived = (await http.get("/queues/critical?state=archived")).text
    assert 'href="/errors?queue=critical&amp;state=archived">Group by error</a>' in archived
    retry = (await http.get("/queues/default?state=retry")).text
    assert 'href="/errors?queue=default&amp;state=retry">Group by error</a>' in retry
    assert "Group by error" not in (await http.get("/queues/default?state=pending")).text
