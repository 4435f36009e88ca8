"""Stored data of every key kind corrupted under running components (issue 25, beyond the
list): a worker, the web UI, the CLI and the dashboard keep working for what is intact.

Every key of queue ``default`` (task hashes, state lists and sets, leases, groups) and
every server, worker and scheduler record is replaced by a value of another type, or by
garbage of the same type. The untouched queue ``healthy`` must keep processing, no page
answers a bare 500, and no command ends in a traceback. Every warning or error the
worker, the web UI, the CLI and the dashboard log about a value of the wrong type or an
undecodable one names the key, and so does every page that refuses to show one.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from redis.asyncio import Redis
from structlog.testing import capture_logs
from textual.pilot import Pilot
from textual.widgets import DataTable

from asyncq import Client, ServeMux, Server, Task
from asyncq.cli import main
from asyncq.cli.dash import DashApp, QueuesScreen
from asyncq.web import create_app
from tests.support import webdata
from tests.support.procs import FAST, wait_until

pytestmark = [pytest.mark.xdist_group("fuzz"), pytest.mark.timeout(300)]

_TARGETS = ("asynq:{default}:*", "asynq:servers*", "asynq:workers*", "asynq:schedulers*")
_TARGETS += ("asynq:scheduler_history:*",)


async def _corrupt(redis: Redis, how: str) -> list[bytes]:
    hit: list[bytes] = []
    for pattern in _TARGETS:
        async for key in redis.scan_iter(match=pattern):
            kind = (await redis.type(key)).decode()
            await redis.delete(key)
            if how == "wrong_type":
                if kind == "string":
                    await redis.hset(key, "garbage", "\xff")
                else:
                    await redis.set(key, b"\xff\xfe not a " + kind.encode())
            elif kind == "hash":
                await redis.hset(key, mapping={"msg": b"\xff\x00", "state": "bogus", "x": "-1"})
            elif kind == "list":
                await redis.rpush(key, b"\xff", b"", b"{x}")
            elif kind == "zset":
                await redis.zadd(key, {b"\xff": float("inf"), b"": -1.0, b"{x}": 0})
            elif kind == "set":
                await redis.sadd(key, b"\xff", b"", b"{x}")
            else:
                await redis.set(key, b"\xff\x00")
            hit.append(key)
    await redis.sadd("asynq:queues", b"\xff{bad}")
    return hit


PAGES = [
    "/", "/queues/default", "/queues/healthy", "/servers", "/schedulers", "/redis", "/metrics",
    "/api/queues", "/api/stats", "/api/servers", "/api/schedulers", "/api/type-rates",
    "/api/queues/default", "/api/queues/default/groups", "/search",
] + [f"/queues/default?state={s}" for s in
     ("active", "pending", "scheduled", "retry", "archived", "completed")]  # fmt: skip

COMMANDS = [
    ["stats"], ["queue", "ls"], ["queue", "inspect", "default"], ["queue", "history", "default"],
    ["server", "ls"], ["cron", "ls"], ["group", "ls", "-q", "default"], ["typerate", "ls"],
] + [["task", "ls", "-q", "default", "-s", s] for s in ("active", "pending", "scheduled", "retry",
                                                          "archived", "completed")]  # fmt: skip


# What a log line or a page says about a damaged value: each must name the key.
_DAMAGE_WORDS = ("wrongtype", "undecodable", "unreadable", "unicodedecodeerror", "not utf-8")


def _unnamed(texts: Sequence[str], hit: Sequence[bytes]) -> list[str]:
    """The *texts* that speak of a damaged value without naming any damaged key."""
    names = [k.decode(errors="replace") for k in hit] + ["asynq:queues"]
    return [
        t
        for t in texts
        if any(w in t.lower() for w in _DAMAGE_WORDS) and not any(n in t for n in names)
    ]


def _log_texts(logs: list[dict[str, Any]]) -> list[str]:
    return [repr(e) for e in logs if e.get("log_level") in ("warning", "error", "critical")]


async def _until(pilot: Pilot[None], cond: Callable[[], bool], what: str) -> None:
    for _ in range(400):
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("how", ["wrong_type", "garbage"])
async def test_every_component_survives_corrupted_records(
    redis: Redis, redis_url: str, how: str
) -> None:
    with capture_logs() as logs:
        hit = await _run_components(redis, redis_url, how)
    assert not _unnamed(_log_texts(logs), hit), _unnamed(_log_texts(logs), hit)[:5]


async def _run_components(redis: Redis, redis_url: str, how: str) -> list[bytes]:
    """Corrupt the stored data under a running worker, the web UI, the CLI and the
    dashboard; assert each keeps going; the keys corrupted."""
    await webdata.seed(redis)
    done: list[str] = []
    mux = ServeMux()

    async def handle(task: Task) -> None:
        done.append(task.payload.decode())

    mux.handle("healthy", handle)
    # The damaged queue first: a multi-queue script meets its keys before the healthy ones.
    server = Server(redis, concurrency=2, queues={"default": 1, "healthy": 1}, **FAST)
    await server.start(mux)
    app = create_app(redis_url)
    try:
        hit = await _corrupt(redis, how)
        assert len(hit) > 10
        async with Client(redis) as client:
            for _ in range(3):
                await client.enqueue(Task("healthy", b"ok"), queue="healthy")
            # Forwarded by the same script call that meets the damaged queue's keys.
            await client.enqueue(
                Task("healthy", b"scheduled"), queue="healthy", process_in=timedelta(seconds=1)
            )
        await wait_until(lambda: len(done) >= 3, what="the healthy queue processed", within=60)
        await wait_until(lambda: "scheduled" in done, what="a scheduled healthy task", within=60)

        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://localhost"
            ) as web,
        ):
            for path in PAGES:
                r = await web.get(path)
                assert r.status_code != 500, (how, path, r.text[:400])
                if r.status_code >= 400:
                    assert "error" in r.text.lower(), (how, path, r.text[:400])
                    assert not _unnamed([html.unescape(r.text)], hit), (how, path, r.text[:600])
            # The summaries keep every healthy queue.
            for path in ("/", "/api/queues", "/metrics", "/queues/healthy"):
                r = await web.get(path)
                assert r.status_code == 200, (how, path, r.text[:400])
                assert "healthy" in r.text, (how, path)

        for args in COMMANDS:
            result = await asyncio.to_thread(CliRunner().invoke, main, ["-u", redis_url, *args])
            assert "Traceback" not in result.output, (how, args, result.output[-1500:])
            assert not _unnamed([result.output], hit), (how, args, result.output[-1500:])
            assert result.exit_code in (0, 1), (how, args, result.output[-1500:])
            if result.exception is not None and result.exit_code != 1:
                raise result.exception

        dash = DashApp(redis_url, refresh=60)
        async with dash.run_test(size=(160, 40)) as pilot:
            await _until(pilot, lambda: isinstance(dash.screen, QueuesScreen), "the queues screen")

            def listed() -> list[str]:
                return [str(k.value) for k in dash.screen.query_one("#queues", DataTable).rows]

            await _until(pilot, lambda: "healthy" in listed(), "the healthy queue listed")
        assert dash.return_code in (None, 0)

        # The worker is still alive: a later task of the healthy queue runs too.
        async with Client(redis) as client:
            await client.enqueue(Task("healthy", b"later"), queue="healthy")
        await wait_until(lambda: "later" in done, what="a later healthy task", within=60)
    finally:
        await server.shutdown()
    return hit
