"""Events name their workflow and can be followed by workflow or task id, in the API,
the CLI and the web UI; an App with events=True records its own enqueues; the Events
page does not drown in progress events (issue 41, item 9)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

import asyncq
from asyncq import App, Client, Event, ServeMux, Server, Task, chain
from asyncq.events import EVENTS_KEY
from asyncq.web import create_app
from tests.support.procs import FAST, ROOT, wait_until


async def _collect(stream: AsyncIterator[Event], until: Any, within: float = 30) -> list[Event]:
    """Events from *stream* until *until(events)* holds (at most *within* seconds)."""
    got: list[Event] = []
    async with asyncio.timeout(within):
        async for event in stream:
            got.append(event)
            if until(got):
                return got
    raise AssertionError("unreachable")


@pytest.fixture
async def worker(redis: Redis) -> AsyncIterator[Server]:
    async def step(task: Task) -> None:
        asyncq.progress(0.5, "half")

    mux = ServeMux()
    mux.handle("step", step)
    mux.handle("other", step)
    server = Server(redis, events=True, **FAST)
    await server.start(mux)
    try:
        yield server
    finally:
        await server.shutdown()


async def _workflow_and_other(client: Client) -> tuple[str, list[str], str]:
    handle = await chain(Task("step"), Task("step", retention=timedelta(hours=1))).enqueue(client)
    other = await client.enqueue(Task("other"))
    await handle.result(timeout=30)
    step_ids = [s.id for stage in handle.stages for s in stage]
    return handle.id, step_ids, other.id


async def test_events_carry_the_workflow_and_filter_by_workflow_and_task(
    redis: Redis, worker: Server
) -> None:
    async with Client(redis, events=True) as client:
        wid, (first, second), other = await _workflow_and_other(client)

        def both_done(got: list[Event]) -> bool:
            return {e.task_id for e in got if e.kind == "succeeded"} >= {first, second}

        flow = await _collect(client.events(workflows=[wid], since="0"), both_done)
        assert {e.workflow for e in flow} == {wid}
        assert {e.task_id for e in flow} == {first, second}

        # The client writes "enqueued" just after the enqueue (batched per loop turn), so a
        # task picked up at once may show "started" first (docs/events.md): order the rest.
        def kinds(events: list[Event], task_id: str) -> list[str]:
            got = [e.kind for e in events if e.task_id == task_id]
            return ["enqueued"] * got.count("enqueued") + [k for k in got if k != "enqueued"]

        assert kinds(flow, first) == ["enqueued", "started", "progress", "succeeded"]
        # The second step is enqueued by the first's acknowledgement, inside Redis.
        assert kinds(flow, second) == ["started", "progress", "succeeded"]

        def other_done(got: list[Event]) -> bool:
            return {"enqueued", "succeeded"} <= {e.kind for e in got}

        alone = await _collect(client.events(task_ids=[other], since="0"), other_done)
        assert {(e.task_id, e.workflow) for e in alone} == {(other, "")}
        assert kinds(alone, other) == ["enqueued", "started", "progress", "succeeded"]
        with pytest.raises(TypeError, match="workflows must be a collection"):
            client.events(workflows=wid)


async def test_an_app_with_events_records_its_own_enqueues(redis: Redis, redis_url: str) -> None:
    app = App(redis_url, events=True)

    @app.task(name="ev:noop")
    async def noop() -> None:
        return None

    try:
        handle = await noop.enqueue()
        # Written in the background, with the other events of the same loop turn.
        await wait_until(lambda: redis.xlen(EVENTS_KEY), what="an event")
        entries = await redis.xrange(EVENTS_KEY)
        assert [(f[b"kind"], f[b"id"]) for _, f in entries] == [(b"enqueued", handle.id.encode())]
    finally:
        await app.aclose()


async def test_web_feed_and_page_filter_by_workflow_and_hide_progress(
    redis: Redis, redis_url: str, worker: Server
) -> None:
    async with Client(redis, events=True) as client:
        wid, (first, second), other = await _workflow_and_other(client)
    await wait_until(
        lambda: redis.xlen(EVENTS_KEY),
        what="events written",
    )
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):

        async def feed(query: str) -> list[dict[str, Any]]:
            resp = await http.get(f"/api/events?{query}")
            assert resp.status_code == 200, resp.text
            events: list[dict[str, Any]] = resp.json()["events"]
            return events

        async def settled() -> bool:  # the worker's last events are batched per loop turn
            kinds = [e["kind"] for e in await feed(f"task={other}")]
            return "succeeded" in kinds and len(await feed("kind=succeeded")) == 3

        await wait_until(settled, what="every task's events")
        flow = await feed(f"workflow={wid}")
        assert {e["workflow"] for e in flow} == {wid}
        assert {e["task_id"] for e in flow} == {first, second}
        assert "progress" in {e["kind"] for e in flow}  # the feed keeps them by default
        assert "progress" not in {e["kind"] for e in await feed(f"workflow={wid}&progress=0")}
        assert {e["task_id"] for e in await feed(f"task={other}")} == {other}
        assert (await http.get("/api/events?progress=yes")).status_code == 400

        page = (await http.get("/events")).text  # the default view: no progress rows
        assert 'class="ev-succeeded"' in page and 'class="ev-progress"' not in page
        assert f'href="/events?workflow={wid}"' in page  # a step links to its workflow's events
        shown = (await http.get("/events?progress=1")).text
        assert 'class="ev-progress"' in shown
        assert 'class="ev-progress"' in (await http.get("/events?kind=progress")).text
        only = (await http.get(f"/events?workflow={wid}")).text
        assert first[:8] in only and other[:8] not in only


async def test_cli_tail_by_workflow(redis: Redis, redis_url: str, worker: Server) -> None:
    async with Client(redis, events=True) as client:
        wid, (first, second), _ = await _workflow_and_other(client)

    async def all_written() -> bool:
        entries = await redis.xrange(EVENTS_KEY)
        done = [f for _, f in entries if f[b"kind"] == b"succeeded"]
        return len(done) == 3

    await wait_until(all_written, what="every task's events")
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "asyncq.cli", "-u", redis_url, "events", "tail",
         "--workflow", wid, "--kind", "succeeded", "--since", "0", "-n", "2"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    for line, task_id in zip(lines, (first, second), strict=True):
        assert f"succeeded  default  step  {task_id}  workflow={wid}" in line
