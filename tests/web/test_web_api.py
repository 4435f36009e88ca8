"""The web app's JSON API and pages through the ASGI app (httpx), over Go-written and
asyncq-written Redis; auth, read-only mode, CSRF and Redis-down behaviour."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import Client, Inspector, Task
from asyncq.web import Auth, create_app
from tests.support import webdata
from tests.support.redis_server import RedisServer

H = {"X-Asyncq-Request": "1"}


@pytest.fixture
async def seeded(redis: Redis) -> webdata.Seeded:
    return await webdata.seed(redis)


@pytest.fixture
async def http(redis_url: str, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as h,
    ):
        yield h


async def test_queues_match_inspector(
    http: httpx.AsyncClient, seeded: webdata.Seeded, redis_url: str
) -> None:
    resp = await http.get("/api/queues")
    assert resp.status_code == 200
    rows = {q["queue"]: q for q in resp.json()["queues"]}
    assert sorted(rows) == ["critical", "default", "low"]
    async with Inspector(redis_url) as insp:
        for name, row in rows.items():
            info = await insp.queue_info(name)
            for key in ("size", "pending", "active", "scheduled", "retry", "archived"):
                assert row[key] == getattr(info, key), (name, key)
            assert row["completed"] == info.completed
            assert row["aggregating"] == info.aggregating
            assert row["paused"] == info.paused
            assert row["processed_total"] == info.processed_total
    assert rows["low"]["paused"] is True
    assert rows["default"]["processed"] == 10
    assert rows["default"]["failed"] == 2
    assert rows["default"]["error_rate"] == pytest.approx(0.2)
    assert rows["critical"]["latency_seconds"] >= 29


async def test_queue_detail_history_groups_and_stats(
    http: httpx.AsyncClient, seeded: webdata.Seeded
) -> None:
    data = (await http.get("/api/queues/default?days=3")).json()
    assert data["queue"]["aggregating"] == 2
    assert [h["processed"] for h in data["history"]][:2] == [10, 7]
    assert data["groups"] == [{"group": "user:42", "size": 2}]
    days = (await http.get("/api/stats?days=2")).json()["days"]
    assert [d["processed"] for d in days] == [7, 10]  # oldest first, summed over queues
    assert (await http.get("/api/stats?days=0")).status_code == 400
    assert (await http.get("/api/queues/nope")).status_code == 404


async def test_list_tasks_paginates_and_renders_payloads(
    http: httpx.AsyncClient, seeded: webdata.Seeded
) -> None:
    page1 = (await http.get("/api/queues/critical/tasks?state=pending&size=3")).json()
    assert page1["total"] == 4
    assert page1["pages"] == 2
    assert len(page1["tasks"]) == 3
    page2 = (await http.get("/api/queues/critical/tasks?state=pending&size=3&page=2")).json()
    ids = [t["id"] for t in page1["tasks"] + page2["tasks"]]
    assert sorted(ids) == sorted([t.id for t in seeded.pending] + [seeded.binary.id])  # type: ignore[union-attr]
    by_id = {t["id"]: t for t in page1["tasks"] + page2["tasks"]}
    assert by_id[seeded.binary.id]["payload"]["kind"] == "hex"  # type: ignore[union-attr]
    assert by_id[seeded.pending[0].id]["payload"]["kind"] == "json"
    agg = (await http.get("/api/queues/default/tasks?state=aggregating")).json()
    assert agg["group"] == "user:42"
    assert {t["id"] for t in agg["tasks"]} == {t.id for t in seeded.aggregating}
    bad = await http.get("/api/queues/default/tasks?state=bogus")
    assert bad.status_code == 400
    assert "unknown task state" in bad.json()["error"]["message"]
    assert (await http.get("/api/queues/default/tasks?size=100000")).status_code == 400


async def test_task_detail_search_servers_schedulers_redis(
    http: httpx.AsyncClient, seeded: webdata.Seeded
) -> None:
    assert seeded.completed is not None and seeded.active is not None
    task = (await http.get(f"/api/queues/default/tasks/{seeded.completed.id}")).json()["task"]
    assert task["state"] == "completed"
    assert task["result"]["kind"] == "json"
    assert '"rows": 12' in task["result"]["text"]
    found = (await http.get(f"/api/tasks/{seeded.completed.id}")).json()["tasks"]
    assert [t["queue"] for t in found] == ["default"]
    assert (await http.get("/api/tasks/no-such-id")).status_code == 404
    servers = (await http.get("/api/servers")).json()["servers"]
    assert len(servers) == 1
    assert servers[0]["queues"] == {"critical": 6, "default": 3, "low": 1}
    assert [w["task_id"] for w in servers[0]["active_workers"]] == [seeded.active.id]
    entries = (await http.get("/api/schedulers")).json()["entries"]
    assert [e["id"] for e in entries] == ["entry-1"]
    assert entries[0]["options"] == ['Queue("default")']
    events = (await http.get("/api/schedulers/entry-1/events")).json()["events"]
    assert [e["task_id"] for e in events] == seeded.event_ids  # newest first
    info = (await http.get("/api/redis")).json()
    assert "redis_version" in info["info"]
    assert info["cluster"] is None


async def test_mutations_change_redis(
    http: httpx.AsyncClient, seeded: webdata.Seeded, redis: Redis
) -> None:
    assert seeded.scheduled is not None and seeded.retry is not None
    assert (await http.post("/api/queues/critical/pause", headers=H)).status_code == 200
    assert await redis.exists("asynq:{critical}:paused") == 1
    again = await http.post("/api/queues/critical/pause", headers=H)
    assert again.status_code == 409
    assert (await http.post("/api/queues/critical/resume", headers=H)).status_code == 200
    assert await redis.exists("asynq:{critical}:paused") == 0

    tid = seeded.scheduled.id
    resp = await http.post(f"/api/queues/default/tasks/{tid}/archive", headers=H)
    assert resp.status_code == 200
    assert await redis.zscore("asynq:{default}:archived", tid) is not None
    assert await redis.hget(f"asynq:{{default}}:t:{tid}", "state") == b"archived"
    resp = await http.post(f"/api/queues/default/tasks/{tid}/run", headers=H)
    assert resp.status_code == 200
    assert tid.encode() in await redis.lrange("asynq:{default}:pending", 0, -1)

    resp = await http.post(
        "/api/queues/default/batch/delete",
        headers=H,
        json={"ids": [a.id for a in seeded.archived] + ["missing"]},
    )
    body = resp.json()
    assert sorted(body["done"]) == sorted(a.id for a in seeded.archived)
    assert list(body["errors"]) == ["missing"]
    assert await redis.zcard("asynq:{default}:archived") == 0

    resp = await http.post("/api/queues/default/states/retry/run_all", headers=H)
    assert resp.json() == {"ok": True, "count": 1}
    assert seeded.retry.id.encode() in await redis.lrange("asynq:{default}:pending", 0, -1)
    resp = await http.post("/api/queues/critical/states/pending/delete_all", headers=H)
    assert resp.json()["count"] == 4
    assert await redis.llen("asynq:{critical}:pending") == 0
    resp = await http.post(
        "/api/queues/default/states/aggregating/archive_all?group=user:42", headers=H
    )
    assert resp.json()["count"] == 2
    refused = await http.post(
        f"/api/queues/default/tasks/{seeded.active.id}/delete",  # type: ignore[union-attr]
        headers=H,
    )
    assert refused.status_code == 409
    assert (await http.delete("/api/queues/default", headers=H)).status_code == 409
    assert (await http.delete("/api/queues/default?force=1", headers=H)).status_code == 409


async def test_csrf_header_and_origin_required(
    http: httpx.AsyncClient, seeded: webdata.Seeded, redis: Redis
) -> None:
    resp = await http.post("/api/queues/critical/pause")
    assert resp.status_code == 403
    resp = await http.post(
        "/api/queues/critical/pause", headers={**H, "Origin": "http://evil.example"}
    )
    assert resp.status_code == 403
    assert await redis.exists("asynq:{critical}:paused") == 0
    ok = await http.post("/api/queues/critical/pause", headers={**H, "Origin": "http://test"})
    assert ok.status_code == 200
    page = await http.get("/")
    assert page.headers["x-frame-options"] == "SAMEORIGIN"  # no clickjacking from other sites
    assert page.headers["content-security-policy"] == "frame-ancestors 'self'"
    assert page.headers["x-content-type-options"] == "nosniff"


async def test_read_only_refuses_and_hides_mutations(
    redis_url: str, seeded: webdata.Seeded, redis: Redis
) -> None:
    app = create_app(redis_url, read_only=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h,
    ):
        resp = await h.post("/api/queues/critical/pause", headers=H)
        assert resp.status_code == 405
        assert await redis.exists("asynq:{critical}:paused") == 0
        resp = await h.delete("/api/queues/critical/tasks/x", headers=H)
        assert resp.status_code == 405
        page = await h.get("/queues/default?state=retry")
        assert page.status_code == 200
        assert "data-api=" not in page.text
        assert "read-only" in page.text


async def test_auth_basic_and_bearer(redis_url: str, seeded: webdata.Seeded) -> None:
    app = create_app(redis_url, username="admin", password="pw", token="tok")
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h,
    ):
        missing = await h.get("/api/queues")
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Basic")
        assert (await h.get("/", headers={"Authorization": "Bearer nope"})).status_code == 401
        assert (
            await h.get("/api/queues", headers={"Authorization": "Bearer tok"})
        ).status_code == 200
        basic = base64.b64encode(b"admin:pw").decode()
        assert (
            await h.get("/metrics", headers={"Authorization": f"Basic {basic}"})
        ).status_code == 200
        wrong = base64.b64encode(b"admin:nope").decode()
        assert (await h.get("/", headers={"Authorization": f"Basic {wrong}"})).status_code == 401
        token_as_pw = base64.b64encode(b"anyone:tok").decode()
        assert (
            await h.get("/", headers={"Authorization": f"Basic {token_as_pw}"})
        ).status_code == 200
        assert (await h.get("/static/app.css")).status_code == 200


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="both a username and a password"):
        create_app("redis://localhost", username="a")
    with pytest.raises(ValueError, match="poll_interval"):
        create_app("redis://localhost", poll_interval=timedelta(milliseconds=10))
    with pytest.raises(ValueError, match="page_size"):
        create_app("redis://localhost", page_size=0)


async def test_pages_render_over_go_data(http: httpx.AsyncClient, seeded: webdata.Seeded) -> None:
    assert seeded.completed is not None and seeded.binary is not None
    pages = {
        "/": ["critical", "default", "low", "paused"],
        "/queues/default?state=retry": ["gateway timeout", seeded.retry.id[:8]],  # type: ignore[union-attr]
        "/queues/default?state=aggregating": ["user:42"],
        "/queues/critical?state=pending&size=2&page=2": ["page 2 of 2"],
        f"/queues/default/tasks/{seeded.completed.id}": ["&#34;rows&#34;: 12", "Timeline"],
        f"/queues/critical/tasks/{seeded.binary.id}": ["00 01 02 fe ff"],
        "/servers": ["go-host:4242", "critical</a> (6)"],
        "/schedulers": ["@every 1h", "Queue(&#34;default&#34;)"],
        "/schedulers/entry-1": ["cron-task-0"],
        "/redis": ["redis_version"],
    }
    for path, needles in pages.items():
        resp = await http.get(path)
        assert resp.status_code == 200, path
        for needle in needles:
            assert needle in resp.text, (path, needle)
    found = await http.get(f"/search?id={seeded.completed.id}")
    assert found.status_code == 303
    assert found.headers["location"] == f"/queues/default/tasks/{seeded.completed.id}"
    missing = await http.get("/search?id=nope")
    assert missing.status_code == 404
    assert "No queue holds" in missing.text


async def test_over_asyncq_written_data(
    http: httpx.AsyncClient, client: Client, redis: Redis
) -> None:
    info = await client.enqueue(
        Task.from_json("welcome", {"user": 1}, headers={"tenant": "acme"}), queue="mail"
    )
    sched = await client.enqueue(Task("later", b"plain text"), process_in=timedelta(hours=2))
    data = (await http.get(f"/api/queues/mail/tasks/{info.id}")).json()["task"]
    assert data["headers"] == {"tenant": "acme"}
    assert data["payload"] == {"kind": "json", "text": '{\n  "user": 1\n}', "size": 10}
    listed = (await http.get("/api/queues/default/tasks?state=scheduled")).json()
    assert [t["id"] for t in listed["tasks"]] == [sched.id]
    assert listed["tasks"][0]["payload"]["kind"] == "text"
    resp = await http.post(f"/api/queues/default/tasks/{sched.id}/run", headers=H)
    assert resp.status_code == 200
    assert await redis.hget(f"asynq:{{default}}:t:{sched.id}", "state") == b"pending"


async def test_mounted_under_a_prefix(redis_url: str, seeded: webdata.Seeded) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = Starlette(routes=[Mount("/ops/asyncq", create_app(redis_url))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=outer), base_url="http://t"
    ) as h:
        page = await h.get("/ops/asyncq/")
        assert page.status_code == 200
        assert 'href="/ops/asyncq/queues/critical"' in page.text
        assert 'data-base="/ops/asyncq"' in page.text
        api = await h.get("/ops/asyncq/api/queues")
        assert len(api.json()["queues"]) == 3
        css = await h.get("/ops/asyncq/static/app.css")
        assert css.status_code == 200


async def test_redis_down_is_a_clear_503() -> None:
    server = RedisServer().start()
    url = server.url
    server.cleanup()  # stopped: nothing listens on the port any more
    app = create_app(url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h,
    ):
        page = await h.get("/")
        assert page.status_code == 503
        assert "Redis is unreachable" in page.text
        assert "Traceback" not in page.text
        api = await h.get("/api/queues")
        assert api.status_code == 503
        assert "unreachable" in api.json()["error"]["message"]


async def test_cancel_only_applies_to_active_tasks(
    http: httpx.AsyncClient, seeded: webdata.Seeded, redis: Redis
) -> None:
    assert seeded.active is not None and seeded.scheduled is not None
    async with redis.pubsub() as ps:
        await ps.subscribe("asynq:cancel")
        await ps.get_message(timeout=1)
        resp = await http.post(f"/api/queues/default/tasks/{seeded.active.id}/cancel", headers=H)
        assert resp.status_code == 200
        msg = await ps.get_message(timeout=5)
        assert msg is not None and msg["data"] == seeded.active.id.encode()
    refused = await http.post(f"/api/queues/default/tasks/{seeded.scheduled.id}/cancel", headers=H)
    assert refused.status_code == 409
    assert "only active tasks" in refused.json()["error"]["message"]
    resp = await http.post("/api/queues/default/states/active/cancel_all", headers=H)
    assert resp.json() == {"ok": True, "count": 1}


async def test_a_given_inspector_is_used_and_left_open(
    redis_url: str, seeded: webdata.Seeded
) -> None:
    async with Inspector(redis_url) as insp:
        app = create_app(insp)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h,
        ):
            assert len((await h.get("/api/queues")).json()["queues"]) == 3
        assert await insp.queues() == ["critical", "default", "low"]  # still open


@settings(deadline=None)  # a shared, busy machine: no per-example time limit
@given(
    header=st.one_of(
        st.none(),
        st.text(max_size=80),
        st.binary(max_size=60).map(lambda b: "Basic " + base64.b64encode(b).decode()),
    )
)
def test_auth_accepts_only_the_configured_credentials(header: str | None) -> None:
    auth = Auth(username="admin", password="pw", token="tok")
    good = {
        "Bearer tok",
        "Basic " + base64.b64encode(b"admin:pw").decode(),
    }
    ok = auth.allows(header)
    if header in good:
        assert ok
    elif ok:  # the token as a basic-auth password, any user name
        assert header is not None and header.startswith("Basic ")
        assert base64.b64decode(header[6:]).decode().partition(":")[2] == "tok"


async def test_rate_limits_show_in_api_and_pages(
    http: httpx.AsyncClient, seeded: webdata.Seeded, redis: Redis
) -> None:
    servers_before = (await http.get("/servers")).text
    assert 'id="type-rates"' not in servers_before  # Go servers only: no section
    assert (await http.get("/api/type-rates")).json() == {"type_rates": []}
    await webdata.seed_flow(redis)

    rows = (await http.get("/api/type-rates")).json()["type_rates"]
    assert [t["task_type"] for t in rows] == ["api:partner", "mail"]
    partner, mail = rows
    assert (partner["rate"], partner["per_second"], partner["tokens"]) == ("60/h", 1 / 60, 0)
    assert partner["limited"] == 2 and 0 < partner["next_token_seconds"] <= 60
    assert partner["servers"] == {"60/h": 1}
    assert (mail["rate"], mail["tokens"], mail["limited"]) == ("100/s", None, 0)
    servers = {s["host"]: s for s in (await http.get("/api/servers")).json()["servers"]}
    assert servers["py-host"]["type_rate_limits"] == {"api:partner": "60/h", "mail": "100/s"}
    assert servers["go-host"]["type_rate_limits"] == {}
    q = (await http.get("/api/queues/critical")).json()["queue"]
    assert (q["rate_limit"], q["rate_tokens"], q["ordered"]) == ("50/s", 50, True)

    page = (await http.get("/servers")).text
    assert 'id="type-rates"' in page
    assert "type rates: api:partner 60/h, mail 100/s" in page
    assert "<td>api:partner</td>" in page and "1 at 60/h" in page
    assert "no bucket yet" in page and ">disagree<" not in page
    page = (await http.get("/queues/critical")).text
    assert "<dt>Rate limit</dt><dd>50/s</dd>" in page and "<dt>Ordered</dt>" in page


async def test_errors_have_the_gateways_shape(redis_url: str, redis: Redis) -> None:
    """The web API and the gateway answer errors alike: {"error": {"code", "message", "field"}}."""
    from asyncq.gateway import create_app as create_gateway

    def shape(resp: httpx.Response) -> tuple[int, str, str | None]:
        body = resp.json()
        assert list(body) == ["error"], body
        err = body["error"]
        assert sorted(err) == ["code", "field", "message"], body
        assert isinstance(err["message"], str) and err["message"], body
        return resp.status_code, err["code"], err["field"]

    web = create_app(redis_url, token="sesame")
    gateway = create_gateway(redis_url, token="sesame")
    auth = {"Authorization": "Bearer sesame", **H}
    async with (
        web.router.lifespan_context(web),
        gateway.router.lifespan_context(gateway),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=web), base_url="http://t") as w,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://t") as g,
    ):
        assert shape(await w.get("/api/queues")) == shape(await g.get("/api/queues/q/tasks/x"))
        assert shape(await w.get("/api/queues")) == (401, "unauthorized", None)
        assert shape(await w.get("/api/queues/nosuch/tasks/nope", headers=auth)) == (
            404,
            "queue_not_found",
            None,
        )
        async with Client(redis_url) as client:
            await client.enqueue(Task("x"))
        assert shape(await w.get("/api/queues/default/tasks/nope", headers=auth)) == (
            404,
            "task_not_found",
            None,
        )
        assert shape(await w.get("/api/nowhere", headers=auth)) == (404, "not_found", None)
        bad = await w.get("/api/queues/default/tasks?state=bogus", headers=auth)
        assert shape(bad) == (400, "invalid_request", None)
        assert "unknown task state" in bad.json()["error"]["message"]


async def test_active_tab_shows_when_each_task_started_and_its_deadline(
    http: httpx.AsyncClient, seeded: webdata.Seeded
) -> None:
    """The Active tab takes Started and Deadline from the worker that runs the task."""
    import re

    assert seeded.active is not None
    servers = (await http.get("/api/servers")).json()["servers"]
    worker = servers[0]["active_workers"][0]
    assert worker["task_id"] == seeded.active.id and worker["started"] and worker["deadline"]
    page = await http.get("/queues/default?state=active")
    assert page.status_code == 200
    head = re.search(r"<thead>.*?</thead>", page.text, re.S)
    assert head is not None and "<th>Started</th><th>Deadline</th>" in head.group(0)
    row = re.search(rf'<tr data-id="{seeded.active.id}">.*?</tr>', page.text, re.S)
    assert row is not None
    started = re.search(rf'<td title="{re.escape(worker["started"])}">([^<]*) ago</td>', row[0])
    deadline = re.search(rf'<td title="{re.escape(worker["deadline"])}">in ([^<]*)</td>', row[0])
    assert started and deadline, row[0]
