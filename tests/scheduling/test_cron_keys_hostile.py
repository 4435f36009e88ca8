"""Garbage in the scheduler's own leases (issue 39, item 4): a tick's claim and a shared
entry's listing lease.

hypothesis writes, before a shared scheduler starts, what no scheduler writes into the
claims of its next two ticks and into the entry's listing lease: another Redis type, a
string with no expiry, a claim of no claim's shape (not UTF-8, empty, huge), or a
well-formed claim or lease of another scheduler that lapses soon. The invariants:

- every tick is enqueued exactly once (its derived task ID in ``pending`` once, its
  claim marked done): garbage is replaced at once, a lease of another scheduler is
  waited out, never stolen;
- the entry is listed (the scheduler's entries record names it);
- each replaced value is named once in a warning with its key; a lease that was
  only waited out is not named.

Derandomized and small by default (``ASYNCQ_FUZZ_EXAMPLES``, as the other fuzz tests).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import redis as sync_redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from asyncq import _keys as keys
from asyncq._scheduling.scheduler import Scheduler, entry_identity, tick_task_id
from asyncq.proto.asynq import SchedulerEntry
from asyncq.task import Task
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.xdist_group("fuzz"), pytest.mark.timeout(600)]

FUZZ = settings(
    max_examples=int(os.environ.get("ASYNCQ_FUZZ_EXAMPLES", "6")),
    deadline=None,
    derandomize=os.environ.get("ASYNCQ_FUZZ_EXAMPLES") is None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LAPSE_MS = 800  # a well-formed lease of another scheduler lapses this soon after it is written

value = st.one_of(
    st.sampled_from([b"", b"\xff\xfe", b"nan", b"done", b"x" * 5000, b"\x00"]),
    st.binary(max_size=12),
)
OTHER_TYPES = ("list", "hash", "zset", "set", "stream")
# How each damage is met: replaced (named in a warning) or waited out (named nowhere).
REPLACED = {*OTHER_TYPES, "no expiry", "no claim's shape"}


@st.composite
def damage(draw: st.DrawFn, *, claim: bool) -> tuple[str, bytes]:
    kinds = [*OTHER_TYPES, "no expiry", "another scheduler's"]
    if claim:
        kinds.append("no claim's shape")
    return draw(st.sampled_from(kinds)), draw(value)


def _write(r: sync_redis.Redis, key: str, kind: str, raw: bytes, *, claim: bool) -> None:
    r.delete(key)
    if kind == "list":
        r.rpush(key, raw)
    elif kind == "hash":
        r.hset(key, raw or b"f", b"v")
    elif kind == "zset":
        r.zadd(key, {raw: 1})
    elif kind == "set":
        r.sadd(key, raw)
    elif kind == "stream":
        r.xadd(key, {b"f": raw or b"v"})
    elif kind == "no expiry":
        r.set(key, raw)
    elif kind == "no claim's shape":  # a claim holds "<scheduler id>/<entry id>"
        r.set(key, raw.replace(b"/", b""), px=60_000)
    else:  # a live lease of another scheduler: a claim's shape, or any lister ID
        held = raw.replace(b"/", b"") + b"/other" if claim else raw or b"other"
        r.set(key, held, px=LAPSE_MS)


def _done(r: sync_redis.Redis, key: str) -> bool:
    if r.type(key) != b"string":
        return False  # the garbage is still there
    held = r.get(key)
    return held is not None and held.startswith(b"done:")


def _listed(r: sync_redis.Redis, scheduler_id: str, entry_id: str) -> bool:
    record = r.lrange(keys.scheduler_entries_key(scheduler_id), 0, -1)
    return any(SchedulerEntry().parse(raw).id == entry_id for raw in record)


async def _run(
    r: sync_redis.Redis, url: str, claims: list[tuple[str, bytes]], lister: tuple[str, bytes]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    task = Task(f"cron:hostile:{uuid.uuid4().hex[:8]}")
    capture = capture_logs()  # before the scheduler binds its logger
    logs = capture.__enter__()
    scheduler = Scheduler(
        url,
        shared=True,
        heartbeat_interval=timedelta(seconds=1),
        claim_lease=timedelta(milliseconds=500),
    )
    entry_id = scheduler.register("@every 1s", task)
    identity = entry_identity("@every 1s", task, {})
    first = int(time.time()) + 2
    claim_keys = {keys.scheduler_claim_key(identity, first + i): d for i, d in enumerate(claims)}
    lister_key = keys.scheduler_lister_key(identity)
    for key, (kind, raw) in claim_keys.items():
        _write(r, key, kind, raw, claim=True)
    _write(r, lister_key, *lister, claim=False)
    ticks = {key: tick_task_id(identity, first + i) for i, key in enumerate(claim_keys)}
    try:
        async with scheduler:
            for key in claim_keys:
                await wait_until(lambda key=key: _done(r, key), what=f"the tick of {key} done")
            await wait_until(lambda: _listed(r, scheduler.id, entry_id), what="the entry listed")
    finally:
        capture.__exit__(None, None, None)
    pending = r.lrange("asynq:{default}:pending", 0, -1)
    for key, task_id in ticks.items():
        assert pending.count(task_id.encode()) == 1, (key, claim_keys[key])
        assert r.get(key) == f"done:{scheduler.id}:{task_id}".encode()
    named: dict[str, str] = {}
    for event in logs:
        if event["log_level"] == "warning" and "replaced" in event["event"]:
            assert event["key"] not in named, f"{event['key']} named twice"
            named[event["key"]] = event["found"]
    expected = {k for k, (kind, _) in claim_keys.items() if kind in REPLACED}
    if lister[0] in REPLACED:
        expected.add(lister_key)
    assert set(named) == expected
    r.delete(*claim_keys, lister_key, *(f"asynq:{{default}}:t:{t}" for t in ticks.values()))
    for task_id in ticks.values():
        r.lrem("asynq:{default}:pending", 0, task_id)
    return logs, named


@FUZZ
@given(claims=st.lists(damage(claim=True), min_size=2, max_size=2), lister=damage(claim=False))
def test_garbage_in_the_scheduler_leases_loses_no_tick_and_hides_no_entry(
    r: sync_redis.Redis, redis_url: str, claims: list[tuple[str, bytes]], lister: tuple[str, bytes]
) -> None:
    asyncio.run(_run(r, redis_url, claims, lister))


def test_a_garbage_value_is_named_as_text_and_cut_short(
    r: sync_redis.Redis, redis_url: str
) -> None:
    _, named = asyncio.run(
        _run(r, redis_url, [("no expiry", b"\xff" * 300), ("hash", b"f")], ("no expiry", b"\xfe"))
    )
    shown = sorted(named.values(), key=len)
    assert shown == ["\\xfe", "a hash", "\\xff" * 19 + "\\..."]
