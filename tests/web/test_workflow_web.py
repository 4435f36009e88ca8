"""The web UI's workflow page and API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from redis.asyncio import Redis

from asyncq import Client, Task, chord
from asyncq.web import create_app

H = {"X-Asyncq-Request": "1"}


@pytest.fixture
async def http(redis_url: str, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as h,
    ):
        yield h


async def test_workflow_page_api_and_cancel(http: httpx.AsyncClient, client: Client) -> None:
    info = await chord([Task("m<x>"), Task("m")], Task("cb", retention=timedelta(hours=1))).enqueue(
        client, workflow_id="wf-web"
    )
    page = await http.get("/queues/default/workflows/wf-web")
    assert page.status_code == 200
    assert "Workflow <code>wf-web</code>" in page.text
    assert "m&lt;x&gt;" in page.text  # escaped
    assert "Cancel workflow" in page.text
    assert f"/queues/default/tasks/{info.stages[0][0].id}" in page.text
    data = (await http.get("/api/queues/default/workflows/wf-web")).json()
    assert data["state"] == "running"
    assert [s["state"] for s in data["stages"][0]] == ["pending", "pending"]
    assert data["stages"][1][0]["state"] == "waiting"
    resp = await http.post("/api/queues/default/workflows/wf-web/cancel", headers=H)
    assert resp.json() == {"ok": True, "previous_state": "running"}
    data = (await http.get("/api/queues/default/workflows/wf-web")).json()
    assert data["state"] == "canceled"
    assert "Cancel workflow" not in (await http.get("/queues/default/workflows/wf-web")).text
    assert (await http.get("/api/queues/default/workflows/nope")).status_code == 404
    assert (await http.get("/queues/default/workflows/nope")).status_code == 404
    # a mutation without the CSRF header is refused
    refused = await http.post("/api/queues/default/workflows/wf-web/cancel")
    assert refused.status_code in (400, 403)
