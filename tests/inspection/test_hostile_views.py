"""Every summary view with hostile data in Redis (issue 25 items 7-11): one bad record is
skipped and named, every healthy queue keeps working."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from click.testing import CliRunner
from redis.asyncio import Redis
from textual.pilot import Pilot
from textual.widgets import DataTable

from asyncq import Client, Inspector, Task
from asyncq.cli import main
from asyncq.cli.dash import DashApp, QueuesScreen
from asyncq.web import create_app
from tests.support.acl import temporary_acl_user

BAD_NAMES = [b"x{y}", b"\xff\xfe", b" ", b"a}b"]


@pytest.fixture
async def web(redis_url: str, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as h,
    ):
        yield h


async def _seed_bad_names(redis: Redis) -> None:
    async with Client(redis) as client:
        await client.enqueue(Task("t", b"x"), queue="healthy")
    await redis.sadd("asynq:queues", *BAD_NAMES)


async def test_bad_queue_names_are_skipped_and_named_by_the_inspector(redis: Redis) -> None:
    await _seed_bad_names(redis)
    async with Inspector(redis) as insp:
        assert await insp.queues() == ["healthy"]
        skipped = {s.name: s.reason for s in insp.skipped_queues}
        assert set(skipped) == {"x{y}", "\\xff\\xfe", " ", "a}b"}
        assert "not UTF-8" in skipped["\\xff\\xfe"]
        assert "'{'" in skipped["x{y}"]
        assert all("asynq:queues" in s.message for s in insp.skipped_queues)


async def test_bad_queue_names_leave_the_web_ui_and_metrics_working(
    web: httpx.AsyncClient, redis: Redis
) -> None:
    await _seed_bad_names(redis)
    page = await web.get("/")
    assert page.status_code == 200, page.text[:500]
    assert "healthy" in page.text and "asynq:queues" in page.text
    api = await web.get("/api/queues")
    assert api.status_code == 200, api.text
    assert [q["queue"] for q in api.json()["queues"]] == ["healthy"]
    assert {s["name"] for s in api.json()["skipped"]} == {"x{y}", "\\xff\\xfe", " ", "a}b"}
    assert all("asynq:queues" in s["message"] for s in api.json()["skipped"])
    metrics = await web.get("/metrics")
    assert metrics.status_code == 200, metrics.text
    assert 'queue="healthy"' in metrics.text
    stats = await web.get("/api/stats?days=2")
    assert stats.status_code == 200, stats.text


@pytest.mark.parametrize("args", [["stats"], ["queue", "ls"]])
async def test_bad_queue_names_leave_the_cli_working(
    redis: Redis, redis_url: str, args: list[str]
) -> None:
    await _seed_bad_names(redis)
    result = await asyncio.to_thread(CliRunner().invoke, main, ["-u", redis_url, *args])
    assert result.exit_code == 0, result.output
    assert "healthy" in result.stdout
    assert "asynq:queues" in result.stderr and "x{y}" in result.stderr


async def _until(pilot: Pilot[None], cond: Callable[[], bool], what: str) -> None:
    for _ in range(400):
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_bad_queue_names_leave_the_dashboard_working(redis: Redis, redis_url: str) -> None:
    await _seed_bad_names(redis)
    app = DashApp(redis_url, refresh=60)
    async with app.run_test(size=(160, 40)) as pilot:
        await _until(pilot, lambda: isinstance(app.screen, QueuesScreen), "the queues screen")

        def listed() -> list[str]:
            return [str(k.value) for k in app.screen.query_one("#queues", DataTable).rows]

        await _until(pilot, lambda: listed() == ["healthy"], "the healthy queue")
    assert app.return_code in (None, 0)


# Item 8: payloads nested ~1,000 deep render as text, and a deep batch body is a 400.
@pytest.mark.parametrize("depth", [100, 1000, 5000])
async def test_deeply_nested_payloads_render_as_text(
    web: httpx.AsyncClient, redis: Redis, depth: int
) -> None:
    deep = b"[" * depth + b"]" * depth
    async with Client(redis) as client:
        await client.enqueue(Task("t", deep), queue="deep", task_id="d1")
        await client.enqueue(Task("t", b'{"a": 1}'), queue="deep", task_id="ok")
    for path in [
        "/queues/deep?state=pending",
        "/queues/deep/tasks/d1",
        "/api/queues/deep/tasks/d1",
    ]:
        r = await web.get(path)
        assert r.status_code == 200, (path, r.text[:300])
    listed = await web.get("/api/queues/deep/tasks?state=pending")
    assert listed.status_code == 200
    kinds = {t["id"]: t["payload"]["kind"] for t in listed.json()["tasks"]}
    assert kinds == {"d1": "json" if depth <= 64 else "text", "ok": "json"}


@pytest.mark.parametrize("depth", [1000, 5000])
async def test_a_deeply_nested_batch_body_is_a_400(
    web: httpx.AsyncClient, redis: Redis, depth: int
) -> None:
    async with Client(redis) as client:
        await client.enqueue(Task("t", b"x"), queue="q", task_id="t1")
    body = '{"ids": ' + "[" * depth + "]" * depth + "}"
    r = await web.post(
        "/api/queues/q/batch/delete",
        content=body,
        headers={"X-Asyncq-Request": "1", "Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text[:300]
    assert "JSON" in r.json()["error"]["message"]


# Item 9: an ACL user without INFO still gets the task counts, and is told what is missing.
async def test_stats_without_the_info_command(redis: Redis, redis_url: str) -> None:
    async with Client(redis) as client:
        for _ in range(3):
            await client.enqueue(Task("t", b"x"), queue="counted")
    rules = ("~*", "&*", "+@all", "-info")
    async with temporary_acl_user(redis, redis_url, "noinfo", *rules) as url:
        for args in (["stats"], ["stats", "--json"]):
            result = await asyncio.to_thread(CliRunner().invoke, main, ["-u", url, *args])
            assert result.exit_code == 0, result.output
            assert "counted" in result.stdout
            assert "INFO" in result.stderr and "left out" in result.stderr
        text = await asyncio.to_thread(CliRunner().invoke, main, ["-u", url, "stats"])
        assert "3" in text.stdout


# Item 10: a page past what Redis can address is a 400 naming the page, and an undecodable
# task shows the same reason in a listing as in its detail.
@pytest.mark.parametrize("page", [2**62, 10**30])
async def test_a_huge_page_number_is_a_400(web: httpx.AsyncClient, redis: Redis, page: int) -> None:
    async with Client(redis) as client:
        await client.enqueue(Task("t", b"x"), queue="q")
    far = await web.get("/api/queues/q/tasks?state=pending&page=1000000000000")
    assert far.status_code == 200 and far.json()["tasks"] == []  # past the end, addressable
    for state in ("pending", "archived"):
        r = await web.get(f"/api/queues/q/tasks?state={state}&page={page}")
        assert r.status_code == 400, r.text
        assert "page" in r.json()["error"]["message"]
        html_page = await web.get(f"/queues/q?state={state}&page={page}")
        assert html_page.status_code == 400
    async with Inspector(redis) as insp:
        with pytest.raises(ValueError, match="page"):
            await insp.list_tasks("q", "pending", page=page)


async def test_an_undecodable_task_lists_with_its_reason(redis: Redis, redis_url: str) -> None:
    await redis.sadd("asynq:queues", "q")
    await redis.lpush("asynq:{q}:pending", "bad1")
    await redis.hset("asynq:{q}:t:bad1", mapping={"msg": b"\xff\x00garbage", "state": "pending"})
    async with Inspector(redis) as insp:
        listed = (await insp.list_tasks("q", "pending"))[0]
        detail = await insp.get_task("q", "bad1")
    assert listed.last_error == detail.last_error
    assert "NoneType" not in listed.last_error
    assert "wire type" in listed.last_error


# Item 11: archiving all tasks past asynq's archive cap (9,999 kept) says so before and
# reports the deletions after, in the API, the UI and the CLI.
N_OVER = 10_050


async def _many_pending(redis: Redis, queue: str, n: int) -> None:
    async with Client(redis) as client:
        out = await client.enqueue_many([Task("t", b"%d" % i) for i in range(n)], queue=queue)
        assert not [o for o in out if isinstance(o, Exception)]


async def test_archive_all_over_the_cap_reports_deletions_in_the_api(
    web: httpx.AsyncClient, redis: Redis
) -> None:
    await _many_pending(redis, "big", N_OVER)
    page = (await web.get("/queues/big?state=pending")).text
    assert "would be deleted" in page and "9,999" in page  # said before, in the confirm
    r = await web.post(
        "/api/queues/big/states/pending/archive_all", headers={"X-Asyncq-Request": "1"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == N_OVER
    assert body["deleted"] == N_OVER - 9_999
    assert "9,999" in body["message"] and f"{N_OVER - 9_999}" in body["message"]
    async with Inspector(redis) as insp:
        assert (await insp.queue_info("big")).archived == 9_999


async def test_archive_all_over_the_cap_reports_deletions_in_the_cli(
    redis: Redis, redis_url: str
) -> None:
    await _many_pending(redis, "big", N_OVER)
    args = ["-u", redis_url, "task", "archiveall", "-q", "big", "-s", "pending"]
    result = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert result.exit_code == 0, result.output
    assert f"{N_OVER} pending tasks archived" in result.stdout
    assert f"{N_OVER - 9_999}" in result.stdout and "deleted" in result.stdout
    assert "9,999" in result.stderr  # the warning before acting
    async with Inspector(redis) as insp:
        report = await insp.archive_all_report("big", "pending")
    assert report.moved == 0 and report.deleted == 0
