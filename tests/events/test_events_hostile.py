"""Unreadable entries in the event stream (issue 39 item 3): every reader shows the events it
can and names the entries it skipped, with their ID and field, instead of failing on them.

The entries are written with a plain XADD, as a hand, a script or a damaged stream would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import structlog
from click.testing import CliRunner
from redis.asyncio import Redis
from structlog.testing import capture_logs

from asyncq.cli import main
from asyncq.events import EVENTS_KEY, SkippedEvent, decode_event, read_events
from asyncq.web import create_app
from tests.support.helpers import wait_until

GOOD = {"kind": "started", "id": "t-1", "type": "email", "queue": "default"}

# (label, fields, the field a reader names): each breaks a conversion some reader made.
BAD: list[tuple[str, dict[str | bytes, str | bytes], str]] = [
    ("nan", {**GOOD, "kind": "progress", "fraction": "nan", "message": "m"}, "fraction"),
    ("inf", {**GOOD, "kind": "progress", "fraction": "inf", "message": "m"}, "fraction"),
    ("huge", {**GOOD, "kind": "progress", "fraction": "1" + "0" * 400}, "fraction"),
    ("big", {**GOOD, "kind": "progress", "fraction": "1e308"}, "fraction"),
    ("hex", {**GOOD, "kind": "progress", "fraction": "0x10"}, "fraction"),
    ("no fraction", {**GOOD, "kind": "progress"}, "fraction"),
    ("not utf-8", {**GOOD, "queue": b"q\xff\xfe"}, "queue"),
    ("not utf-8 message", {**GOOD, "message": b"\xc3("}, "message"),
    ("not utf-8 name", {**GOOD, b"\xff": "x"}, repr(b"\xff")),
    ("no queue", {k: v for k, v in GOOD.items() if k != "queue"}, "queue"),
    ("empty kind", {**GOOD, "kind": ""}, "kind"),
]


@pytest.fixture
def structlog_configured() -> Iterator[None]:
    """asyncq's loggers follow structlog's configuration (which ``capture_logs`` swaps) only
    once structlog is configured; conftest resets it after the test."""
    structlog.configure()
    yield


async def _write(redis: Redis) -> tuple[list[str], dict[str, str]]:
    """Good entries around every bad one; the good entries' IDs, and each bad ID's field."""
    await redis.delete(EVENTS_KEY)
    good: list[str] = []
    bad: dict[str, str] = {}
    for n, (_label, fields, field) in enumerate(BAD):
        ok = await redis.xadd(EVENTS_KEY, {**GOOD, "id": f"ok-{n}"})
        good.append(ok.decode())
        bad[(await redis.xadd(EVENTS_KEY, fields)).decode()] = field  # type: ignore[arg-type]
    last = await redis.xadd(EVENTS_KEY, {**GOOD, "kind": "progress", "fraction": "1.0"})
    good.append(last.decode())
    return good, bad


def test_decode_names_the_field_and_keeps_good_values() -> None:
    for label, fields, field in BAD:
        got = decode_event(b"1700000000000-0", fields)
        assert isinstance(got, SkippedEvent), label
        assert (got.id, got.field) == ("1700000000000-0", field), label
        assert got.message.startswith(f"event 1700000000000-0 skipped: field {field!r} ")
    huge_id = decode_event(b"18446744073709551615-0", GOOD)
    assert isinstance(huge_id, SkippedEvent) and huge_id.field == "entry ID"
    event = decode_event(b"1700000000000-1", {**GOOD, "kind": "progress", "fraction": "0.25"})
    assert not isinstance(event, SkippedEvent)
    assert (event.kind, event.fraction, event.queue) == ("progress", 0.25, "default")


@pytest.mark.usefixtures("structlog_configured")
async def test_read_events_skips_and_logs_each_bad_entry(redis: Redis) -> None:
    good, bad = await _write(redis)
    got: list[str] = []

    async def consume() -> None:
        async for event in read_events(redis, since="0", block=0.05):
            got.append(event.id)

    with capture_logs() as logs:
        reader = asyncio.create_task(consume())
        try:
            await wait_until(lambda: len(got) == len(good), within=30, what="the good events")
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    assert got == good
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert all(e["count"] == 1 and e["key"] == EVENTS_KEY for e in warned)
    lines = [line for e in warned for line in e["entries"]]
    assert len(lines) == len(bad)
    for (entry_id, field), line in zip(bad.items(), lines, strict=True):
        assert line.startswith(f"event {entry_id} skipped: field {field!r} "), line


async def test_cli_tail_prints_valid_json_and_names_the_skipped(
    redis: Redis, redis_url: str
) -> None:
    good, bad = await _write(redis)
    for as_json in ((), ("--json",)):
        args = ["-u", redis_url, "events", "tail", "--since", "0", "-n", str(len(good)), *as_json]
        result = await asyncio.to_thread(CliRunner().invoke, main, args)
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert len(lines) == len(good)
        if as_json:
            # Strict JSON: NaN or Infinity would fail here.
            rows = [json.loads(line, parse_constant=_refuse) for line in lines]
            assert [r["id"] for r in rows] == good
            assert rows[-1]["fraction"] == 1.0
        else:
            assert lines[-1].split()[1:3] == ["progress", "default"] and "100%" in lines[-1]
        for entry_id in bad:
            assert f"event {entry_id} skipped: field " in result.stderr


def _refuse(name: str) -> object:
    raise AssertionError(f"not JSON: {name}")


@pytest.fixture
async def web(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(redis_url)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as h,
    ):
        yield h


@pytest.mark.usefixtures("structlog_configured")
async def test_web_feed_and_page_show_the_rest_and_name_the_skipped(
    redis: Redis, web: httpx.AsyncClient
) -> None:
    good, bad = await _write(redis)
    # Last: an explicit ID past year 9999 (XADD takes any ID above the last one).
    huge = (await redis.xadd(EVENTS_KEY, GOOD, id="18446744073709551614-0")).decode()
    with capture_logs() as logs:
        r = await web.get("/api/events")
    assert r.status_code == 200, r.text
    data = json.loads(r.text, parse_constant=_refuse)
    assert [e["id"] for e in data["events"]] == good
    named = {s["id"]: s["field"] for s in data["skipped"]}
    assert named == {**bad, huge: "entry ID"}
    assert data["last"] == huge
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert len(warned) == 1 and warned[0]["count"] == len(named)

    page = await web.get("/events")
    assert page.status_code == 200
    for entry_id in named:
        assert f"event {entry_id} skipped" in page.text
    assert f'data-last="{huge}"' in page.text

    # The live page polls after the last entry read: nothing repeats, new ones come.
    again = (await web.get("/api/events", params={"after": data["last"]})).json()
    assert again == {"events": [], "skipped": [], "last": None}
    middle = good[len(good) // 2]
    after = (await web.get("/api/events", params={"after": middle})).json()
    assert [e["id"] for e in after["events"]] == [g for g in good if _order(g) > _order(middle)]
    assert {s["id"] for s in after["skipped"]} == {i for i in named if _order(i) > _order(middle)}


def _order(stream_id: str) -> tuple[int, int]:
    ms, seq = stream_id.split("-")
    return int(ms), int(seq)


async def test_web_feed_cursor_passes_entries_a_filter_hides(
    redis: Redis, web: httpx.AsyncClient
) -> None:
    await redis.delete(EVENTS_KEY)
    first = (await redis.xadd(EVENTS_KEY, GOOD)).decode()
    bad = (await redis.xadd(EVENTS_KEY, {**GOOD, "kind": "progress", "fraction": "nan"})).decode()
    data = (await web.get("/api/events", params={"after": first, "kind": "failed"})).json()
    assert data["events"] == [] and data["last"] == bad
    assert [s["id"] for s in data["skipped"]] == [bad]
