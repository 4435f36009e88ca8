"""The web UI's durable run pages and API: a run's page (its entries, what it waits
for, Cancel and the signal form), the list, cancelling and signalling through the API
(the CSRF header required), hostile queue names and run ids escaped and routed."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from redis.asyncio import Redis

from asyncq import Client, Server, Task
from asyncq import _keys as keys
from asyncq._http import quote_segment
from asyncq.web import create_app
from tests.support import durable_app as d
from tests.support.helpers import wait_until

H = {"X-Asyncq-Request": "1"}
Q = d.QUEUE
ODD_QUEUE = "q/<b>&\"'ü .."
ODD_RUN = "r/<i>&'\" ..%2e"


@pytest.fixture
async def http(redis_url: str, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as h,
    ):
        yield h


@pytest.fixture
async def worker(redis_url: str, redis: Redis) -> AsyncIterator[Server]:
    d.app.redis = redis_url
    server = await d.start_worker()
    try:
        yield server
    finally:
        await server.shutdown()
        await d.app.aclose()


async def test_run_page_api_signal_and_cancel(http: httpx.AsyncClient, worker: Server) -> None:
    first = await d.fickle.start()  # a step, then a wait for fickle/k
    second = await d.waiter.start("<k>", None)

    async def run_state(run_id: str) -> str | None:
        got = await http.get(f"/api/queues/{Q}/durable/{run_id}")
        return got.json()["state"] if got.status_code == 200 else None

    async def waits(run_id: str) -> bool:  # for its signal, not for a step on the way
        got = await http.get(f"/api/queues/{Q}/durable/{run_id}")
        return got.status_code == 200 and (got.json()["waiting_for"] or {}).get("kind") == "signal"

    await wait_until(lambda: waits(first.id), what="first waits")
    await wait_until(lambda: waits(second.id), what="second waits")

    page = await http.get(f"/queues/{Q}/durable/{first.id}")
    assert page.status_code == 200
    assert f"Durable run <code>{first.id}</code>" in page.text
    assert "step d:add {&#34;a&#34;:2,&#34;b&#34;:3}" in page.text  # escaped
    assert "signal fickle / k (no timeout)" in page.text
    assert "Cancel run" in page.text and 'id="signal-form"' in page.text
    assert 'value="fickle"' in page.text  # the form names the signal it waits for
    data = (await http.get(f"/api/queues/{Q}/durable/{first.id}")).json()
    assert [(e["kind"], e["result"]) for e in data["entries"]] == [("step", "5"), ("wait", None)]
    assert data["waiting_for"]["signal_name"] == "fickle"

    listed = (await http.get("/api/durable", params={"queue": Q})).json()
    assert {r["id"] for r in listed["runs"]} == {first.id, second.id}
    assert listed["cursor"] is None
    runs_page = await http.get("/durable")
    assert f"/queues/{Q}/durable/{second.id}" in runs_page.text
    assert "signal go / &lt;k&gt;" in runs_page.text
    assert f"/durable?queue={Q}" in (await http.get(f"/queues/{Q}")).text

    # the signal form's request, then the cancel button's
    sent = await http.post(
        f"/api/queues/{Q}/signal", json={"name": "go", "key": "<k>", "payload": [1]}, headers=H
    )
    assert sent.json() == {"ok": True, "took": 1, "message": "Signal taken by 1 run"}
    assert await second.result(timeout=20) == {"got": [1]}
    cancelled = await http.post(f"/api/queues/{Q}/durable/{first.id}/cancel", headers=H)
    assert cancelled.json()["previous_state"] == "waiting"
    assert await run_state(first.id) == "cancelled"
    assert "Cancel run" not in (await http.get(f"/queues/{Q}/durable/{first.id}")).text

    # refused: without the CSRF header, a body that is not the signal, unknown runs
    assert (await http.post(f"/api/queues/{Q}/durable/{first.id}/cancel")).status_code in (
        400,
        403,
    )
    for body in ({"key": "x"}, {"name": 1}, {"name": "a", "key": 2}, [1]):
        bad = await http.post(f"/api/queues/{Q}/signal", json=body, headers=H)
        assert bad.status_code == 400, body
    bad = await http.post(f"/api/queues/{Q}/signal", json={"name": "a{b"}, headers=H)
    assert bad.status_code == 400 and "holds '{'" in bad.json()["error"]["message"]
    gone = await http.get(f"/api/queues/{Q}/durable/nope")
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "durable_run_not_found"
    assert (await http.get(f"/queues/{Q}/durable/nope")).status_code == 404
    assert (await http.get("/api/queues/nosuch/durable/x")).status_code == 404


async def test_hostile_queue_and_run_id_are_escaped_and_routed(
    http: httpx.AsyncClient, redis: Redis, client: Client
) -> None:
    await client.enqueue(
        Task("t<script>"), task_id=ODD_RUN, queue=ODD_QUEUE, process_in=timedelta(hours=1)
    )
    await redis.hset(
        keys.run_key(ODD_QUEUE, ODD_RUN),
        mapping={"s:0": "wait <img src=x> &k", "state": "waiting", "until": "253402300799"},
    )
    await redis.sadd(keys.awaiting_key(ODD_QUEUE, "<img", "src=x> &k"), f"{ODD_RUN} 0")
    path = f"/queues/{quote_segment(ODD_QUEUE)}/durable/{quote_segment(ODD_RUN)}"
    page = await http.get(path)
    assert page.status_code == 200
    assert "<img src=x>" not in page.text and "<script>" not in page.text
    assert "wait &lt;img src=x&gt; &amp;k" in page.text
    (call,) = [html.unescape(m) for m in re.findall(r'data-api="([^"]+)"', page.text)]
    assert call == f"POST {path[1:]}/cancel"
    listed = await http.get("/durable")
    assert html.escape(path) in listed.text
    cancelled = await http.post("/api" + path + "/cancel", headers=H)
    assert cancelled.json()["previous_state"] == "waiting"
    assert await redis.hget(keys.task_key(ODD_QUEUE, ODD_RUN), "state") == b"archived"
    assert not await redis.exists(keys.awaiting_key(ODD_QUEUE, "<img", "src=x> &k"))
    # a run id with a brace is refused with a clear error, not looked up
    brace = await http.get(f"/api/queues/{quote_segment(ODD_QUEUE)}/durable/a%7Db")
    assert brace.status_code == 400 and "run ID 'a}b' holds" in brace.json()["error"]["message"]


async def test_a_run_not_attempted_yet_is_shown_pending_and_can_be_cancelled(
    http: httpx.AsyncClient, redis_url: str
) -> None:
    d.app.redis = redis_url
    try:
        handle = await d.chain3.start(4)  # no worker: it waits for its first attempt
    finally:
        await d.app.aclose()
    data = (await http.get(f"/api/queues/{Q}/durable/{handle.id}")).json()
    assert (data["state"], data["task_state"], data["entries"]) == ("pending", "pending", [])
    listed = (await http.get("/api/durable", params={"queue": Q})).json()
    assert [(r["id"], r["state"]) for r in listed["runs"]] == [(handle.id, "pending")]
    runs_page = await http.get("/durable")
    assert f"/queues/{Q}/durable/{handle.id}" in runs_page.text
    page = await http.get(f"/queues/{Q}/durable/{handle.id}")
    assert 'id="run-state">pending<' in page.text and "No entries recorded yet." in page.text
    assert "Cancel run" in page.text
    cancelled = await http.post(f"/api/queues/{Q}/durable/{handle.id}/cancel", headers=H)
    assert cancelled.json()["previous_state"] == "pending"
    assert cancelled.json()["message"] == "Run cancelled"
    assert (await http.get(f"/api/queues/{Q}/durable/{handle.id}")).json()["state"] == "cancelled"
