"""The web API and pages over a Redis state written by the real Go asynq v0.26.0.

``tests/fixtures/go-asynq-v0.26/state.json`` is a dump of every key while a Go
server, scheduler and aggregator ran (see its ``manifest``). It is restored
byte for byte; only the heartbeat index scores are moved into the future so the
Go server and scheduler count as alive.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from asyncq import Inspector
from asyncq.web import create_app

STATE = Path(__file__).parents[1] / "fixtures" / "go-asynq-v0.26" / "state.json"
_HEARTBEATS = ("asynq:servers", "asynq:workers", "asynq:schedulers")


async def restore(r: Redis) -> None:
    keys = json.loads(STATE.read_text())["keys"]
    alive = int(time.time()) + 3600
    for k in keys:
        name, kind, value = k["key"], k["type"], k["value"]
        if kind == "string":
            await r.set(name, bytes.fromhex(value))
        elif kind == "hash":
            await r.hset(name, mapping={f: bytes.fromhex(v) for f, v in value.items()})
        elif kind == "list":
            await r.rpush(name, *[bytes.fromhex(v) for v in value])
        elif kind == "set":
            await r.sadd(name, *[bytes.fromhex(v) for v in value])
        elif kind == "zset":
            score = (lambda s: alive) if name in _HEARTBEATS else (lambda s: s)
            await r.zadd(name, {bytes.fromhex(m): score(s) for m, s in value})
        else:
            raise AssertionError(f"unexpected key type {kind} for {name}")


@pytest.fixture
async def http(redis_url: str, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    await restore(redis)
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h,
    ):
        yield h


async def test_api_over_go_state(http: httpx.AsyncClient, redis_url: str) -> None:
    queues = {q["queue"]: q for q in (await http.get("/api/queues")).json()["queues"]}
    assert sorted(queues) == ["critical:high-prio", "cron", "default", "low", "work"]
    assert queues["low"]["paused"] is True
    async with Inspector(redis_url) as insp:
        for name, row in queues.items():
            info = await insp.queue_info(name)
            assert row["size"] == info.size
            assert row["aggregating"] == info.aggregating

    task = (await http.get("/api/queues/work/tasks/w-complete")).json()["task"]
    assert task["state"] == "completed"
    assert task["result"] == {"kind": "text", "text": "golden-result:w-complete", "size": 24}
    headers = (await http.get("/api/queues/default/tasks/p-headers")).json()["task"]
    assert headers["headers"] == {"tenant": "acme", "trace-id": "abc123"}
    archived = (await http.get("/api/queues/work/tasks?state=archived")).json()["tasks"]
    assert [t["id"] for t in archived] == ["w-archive"]
    assert "skip retry" in archived[0]["last_error"]
    retry = (await http.get("/api/queues/work/tasks?state=retry")).json()["tasks"]
    assert retry[0]["last_error"] == "golden: planned failure on attempt 1"
    groups = (await http.get("/api/queues/work/groups")).json()["groups"]
    assert groups and all(g["size"] >= 1 for g in groups)
    found = (await http.get("/api/tasks/w-active")).json()["tasks"]
    assert [(t["queue"], t["state"]) for t in found] == [("work", "active")]

    servers = (await http.get("/api/servers")).json()["servers"]
    assert [s["pid"] for s in servers] == [10270]
    assert [w["task_id"] for w in servers[0]["active_workers"]] == ["w-active"]
    entries = (await http.get("/api/schedulers")).json()["entries"]
    assert entries
    events = (await http.get(f"/api/schedulers/{entries[0]['id']}/events")).json()["events"]
    assert events


async def test_every_page_over_go_state(http: httpx.AsyncClient) -> None:
    queues = ["critical:high-prio", "cron", "default", "low", "work"]
    states = ["active", "pending", "aggregating", "scheduled", "retry", "archived", "completed"]
    paths = ["/", "/servers", "/schedulers", "/redis", "/metrics"]
    paths += [f"/queues/{q}?state={s}" for q in queues for s in states]
    for q in queues:
        tasks = (await http.get(f"/api/queues/{q}/tasks?state=pending&size=100")).json()["tasks"]
        paths += [f"/queues/{q}/tasks/{t['id']}" for t in tasks]
    paths += ["/queues/work/tasks/w-complete", "/queues/default/tasks/p-binary"]
    for path in paths:
        resp = await http.get(path)
        assert resp.status_code == 200, (path, resp.text[:300])
    binary = (await http.get("/api/queues/default/tasks/p-binary")).json()["task"]["payload"]
    assert binary["kind"] == "hex"
    assert binary["size"] == 256
    assert binary["text"].splitlines()[0].startswith("00000000  00 01 02 03 04 05 06 07")
    page = await http.get("/queues/default/tasks/p-binary")
    assert "hex, 256 bytes" in page.text


async def test_metrics_over_go_state(http: httpx.AsyncClient, redis_url: str) -> None:
    text = (await http.get("/metrics")).text
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    async with Inspector(redis_url) as insp:
        for q in await insp.queues():
            info = await insp.queue_info(q)
            assert got[("asynq_queue_size", (("queue", q),))] == info.size
            assert got[("asynq_tasks_processed_total", (("queue", q),))] == info.processed_total
            assert got[("asynq_queue_paused_total", (("queue", q),))] == int(info.paused)
