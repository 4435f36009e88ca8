"""Listing workflows: ``Inspector.workflows``, ``asyncq workflow ls`` and the web UI's
``/workflows`` page, a page at a time (there is no index: SCAN in bounded chunks)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result
from redis.asyncio import Redis

from asyncq import Client, Inspector, Task, chain, chord, group
from asyncq.cli import main
from asyncq.web import create_app


async def _seed(client: Client) -> dict[str, str]:
    """Seven workflows over two queues (and plain tasks beside them): id -> kind."""
    kinds: dict[str, str] = {}
    for i in range(3):
        await chain(Task("a"), Task("b"), Task("c")).enqueue(client, workflow_id=f"ch{i}")
        kinds[f"ch{i}"] = "chain"
    await chain(group(Task("g"), Task("g"))).enqueue(client, workflow_id="gr")
    kinds["gr"] = "group"
    await chord([Task("m"), Task("m")], Task("cb")).enqueue(client, workflow_id="cd")
    kinds["cd"] = "chord"
    for i in range(2):
        await chain(Task("x", queue="other"), Task("y", queue="other")).enqueue(
            client, workflow_id=f"o{i}"
        )
        kinds[f"o{i}"] = "chain"
    await client.enqueue_many([Task("plain") for _ in range(5)])
    return kinds


async def test_inspector_pages_through_every_workflow_once(
    redis: Redis, client: Client, redis_url: str
) -> None:
    kinds = await _seed(client)
    async with Inspector(redis_url) as insp:
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            page = await insp.workflows(limit=3, cursor=cursor)
            assert len(page.workflows) <= 3
            seen += [w.id for w in page.workflows]
            pages += 1
            cursor = page.cursor
            if cursor is None:
                break
            assert pages < 20
        assert sorted(seen) == sorted(kinds)
        assert pages >= 3
        everything = (await insp.workflows()).workflows
        assert {w.id: w.kind for w in everything} == kinds
        ch0 = next(w for w in everything if w.id == "ch0")
        assert (ch0.queue, ch0.state, ch0.steps_done, ch0.steps_total) == (
            "default",
            "running",
            0,
            3,
        )
        assert ch0.created.tzinfo is not None and ch0.finished is None
        other = (await insp.workflows("other")).workflows
        assert sorted(w.id for w in other) == ["o0", "o1"]
        with pytest.raises(ValueError, match="limit"):
            await insp.workflows(limit=0)
        with pytest.raises(ValueError, match="cursor"):
            await insp.workflows(cursor="garbage")


async def test_cli_workflow_ls(
    redis: Redis, client: Client, redis_url: str, tmp_path: Path
) -> None:
    kinds = await _seed(client)
    runner = CliRunner(env={"HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None})

    def cli(*args: str) -> Result:
        return runner.invoke(main, ["-u", redis_url, "workflow", "ls", *args])

    listed = await asyncio.to_thread(cli, "--json")
    assert listed.exit_code == 0, listed.output
    data = json.loads(listed.output)
    assert data["cursor"] is None
    rows = {w["id"]: w for w in data["workflows"]}
    assert {k: w["kind"] for k, w in rows.items()} == kinds
    assert rows["cd"]["steps_total"] == 3 and rows["cd"]["steps_done"] == 0
    assert rows["cd"]["state"] == "running" and rows["cd"]["created"].endswith("+00:00")

    text = await asyncio.to_thread(cli, "-q", "default")
    assert text.exit_code == 0, text.output
    header, *lines = text.output.splitlines()
    assert header.split() == ["ID", "Queue", "Kind", "State", "Steps", "Created"]
    assert any(re.match(r"cd\s+default\s+chord\s+running\s+0/3\s+\d{4}-", ln) for ln in lines)

    first = await asyncio.to_thread(cli, "-n", "2")
    assert first.exit_code == 0, first.output
    assert first.output.count("running") == 2
    more = re.search(r"More: asyncq workflow ls -n 2 --cursor (\S+)", first.output)
    assert more is not None, first.output
    bad = await asyncio.to_thread(cli, "--cursor", "nope")
    assert bad.exit_code != 0 and "invalid workflow cursor" in bad.output


@pytest.fixture
async def http(redis_url: str, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(redis_url, page_size=3)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as h,
    ):
        yield h


async def test_web_workflow_list_page(http: httpx.AsyncClient, client: Client) -> None:
    kinds = await _seed(client)
    await chain(Task("q"), Task("q")).enqueue(client, workflow_id="a/b c")
    kinds["a/b c"] = "chain"
    home = await http.get("/")
    assert 'href="/workflows"' in home.text  # in the nav
    seen: list[str] = []
    url: str | None = "/workflows"
    pages = 0
    while url is not None:
        page = await http.get(url)
        assert page.status_code == 200, page.text
        links = re.findall(r'<a href="/queues/([^/"]+)/workflows/([^"]+)"', page.text)
        assert len(links) <= 3  # never more than a page
        seen += [httpx.URL("/" + wid).path[1:] for _, wid in links]
        nxt = re.search(r'<a class="next" href="([^"]+)"', page.text)
        url = nxt.group(1).replace("&amp;", "&") if nxt else None
        pages += 1
        assert pages < 20
    assert sorted(seen) == sorted(kinds)
    assert (
        "/queues/default/workflows/a%2Fb%20c"
        in (await http.get("/workflows?queue=default&size=50")).text
    )
    api = (await http.get("/api/workflows?queue=other")).json()
    assert sorted(w["id"] for w in api["workflows"]) == ["o0", "o1"] and api["cursor"] is None
