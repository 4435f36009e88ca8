"""Garbage in every key asyncq adds beside asynq's, under a running worker and client
(issue 39, item 4): the stored-data fuzz of ``test_fuzz_stored.py``, for asyncq's keys.

hypothesis writes values of every type and shape (another Redis type, not UTF-8, nan,
inf, huge, negative, empty) into the queue's concurrency limit, ordered flag, rate
bucket and direct-delivery waiters list, the worker's delivery credit, a task type's
rate bucket, the tasks' progress hashes, the event stream, the metrics-history hashes,
a workflow record and the live server's flow and type-rate records, while a worker
serves the queue and a client enqueues to it. The invariants:

- no task is stranded: every task in ``active`` has a finite lease, or leaves
  ``active`` within the lease + 5 s;
- no acknowledged enqueue is lost: each runs, at the latest once the damage is
  removed (a garbage limit such as ``0`` legitimately holds the queue until then);
- no reader fails: the Inspector, ``asyncq stats``/``queue ls``/``cron ls``/``metrics
  top``, the web API and the event reader all answer;
- every value a reader cannot use is named in a warning with its key, once per read.

The default run is derandomized and small (``ASYNCQ_FUZZ_EXAMPLES``, default 6, sets
the count; ``nox -s fuzz`` searches at random).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as sync_redis
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from asyncq import Client, Inspector, Intervals, Limits, Server, Task, WorkflowNotFoundError
from asyncq import _keys as keys
from asyncq.cli import main
from asyncq.events import recent_events
from asyncq.progress import progress
from asyncq.web import create_app
from tests.support.helpers import wait_until

pytestmark = [pytest.mark.xdist_group("fuzz"), pytest.mark.timeout(600)]

Q = "fzq"
TYPE = "fzt"
WORKFLOW = "wf1"
LEASE = 2.0  # the shortest a server accepts
TASKS = 5
FUZZ = settings(
    # A longer hunt: ASYNCQ_FUZZ_EXAMPLES=100 pytest tests/test_fuzz_asyncq_keys.py
    max_examples=int(os.environ.get("ASYNCQ_FUZZ_EXAMPLES", "6")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Values that look like numbers to one parser and not another (Lua's tonumber takes
# nan, inf, 0x10 and 1e300; Python's int takes none of them), and plain garbage.
value = st.one_of(
    st.sampled_from(
        [
            *(b"", b"nan", b"-nan", b"inf", b"-inf", b"1e300", b"-100", b"9" * 40, b"0x10"),
            *(b"1.5", b"\xff\xfe", b"\x00", b" 7", b"-0", b"18446744073709551616"),
        ]
    ),
    st.binary(max_size=12),
)
# The fields each hash kind's readers look at, so a garbage value lands where it is read.
FIELDS = {
    "rate": ["tat", "interval", "burst", "limited"],
    "type_rate": ["tat", "interval", "burst", "limited"],
    "progress": ["fraction", "message", "time"],
    "metrics": ["p:fzt", "f:fzt", "us:fzt", "h3:fzt", "r:fzt", "h99:fzt"],
    "workflow": ["stages", "n:0", "id:0:0", "state", "stage", "created", "finished", "ttl"],
    "flow": [f"limit:{Q}", f"local:{Q}", f"rate:{Q}", f"ordered:{Q}", "limit:*"],
    "type_rates": [TYPE, "other"],
}
OTHER_TYPES = ("string", "list", "hash", "zset", "set", "stream")


@st.composite
def damage(draw: st.DrawFn, kind: str, natural: str) -> tuple[str, Any]:
    """(Redis type, contents): another type than *natural*, or *natural* full of garbage."""
    if draw(st.booleans()):
        return draw(st.sampled_from([t for t in OTHER_TYPES if t != natural])), draw(value)
    if natural == "hash":
        names = FIELDS[kind]
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names)))
        return "hash", {n: draw(value) for n in chosen}
    if natural == "list":
        return "list", draw(st.lists(value, min_size=1, max_size=3))
    if natural == "stream":
        fields = ["kind", "queue", "type", "id", "fraction", "time", "retried", "error"]
        chosen = draw(st.lists(st.sampled_from(fields), min_size=1, max_size=len(fields)))
        return "stream", {n: draw(value) for n in chosen}
    return natural, draw(value)


# kind -> its Redis type (what asyncq writes there)
KINDS = {
    "limit": "string",
    "ordered": "string",
    "rate": "hash",
    "waiters": "list",
    "credit": "string",
    "type_rate": "hash",
    "progress": "hash",
    "events": "stream",
    "metrics": "hash",
    "workflow": "hash",
    "flow": "hash",
    "type_rates": "hash",
}


@st.composite
def plans(draw: st.DrawFn) -> dict[str, tuple[str, Any]]:
    chosen = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=5, unique=True))
    return {kind: draw(damage(kind, KINDS[kind])) for kind in chosen}


def _write(r: sync_redis.Redis, key: str, kind: str, contents: Any) -> None:
    """Replace *key* by *contents* stored as the Redis type *kind*."""
    r.delete(key)
    if kind == "string":
        r.set(key, contents if isinstance(contents, bytes) else b"x")
    elif kind == "list":
        members = contents if isinstance(contents, list) else [contents]
        r.rpush(key, *members)
    elif kind == "hash":
        r.hset(key, mapping=contents if isinstance(contents, dict) else {contents or b"f": b"v"})
    elif kind == "zset":
        r.zadd(key, {contents if isinstance(contents, bytes) else b"m": 1})
    elif kind == "set":
        r.sadd(key, contents if isinstance(contents, bytes) else b"m")
    else:
        r.xadd(key, contents if isinstance(contents, dict) else {b"f": contents or b"v"})


def _targets(server: Server, minute: int) -> dict[str, list[str]]:
    """The keys each damage kind lands on, for the running *server*."""
    ident = (server.host, server.pid, server.server_id)
    return {
        "limit": [keys.limit_key(Q)],
        "ordered": [keys.ordered_key(Q)],
        "rate": [keys.rate_key(Q)],
        "waiters": [keys.waiters_key(Q)],
        "credit": [keys.delivery_channel(server.server_id)],
        "type_rate": [keys.type_rate_key(TYPE)],
        "progress": [keys.progress_key(Q, f"t{n}") for n in range(TASKS)],
        "events": [keys.EVENTS_KEY],
        "metrics": [keys.metrics_history_key(Q, minute), keys.metrics_history_key(Q, minute - 1)],
        "workflow": [f"{keys.queue_key_prefix(Q)}wf:{WORKFLOW}"],
        "flow": [keys.server_queue_flow_key(*ident)],
        "type_rates": [keys.server_type_rates_key(*ident)],
    }


# The kinds a reader of this test reads (the others only scripts read: a bad waiters
# member or credit is dropped or ignored by the enqueue, see docs/guarantees.md), and
# whether a reader can use a stored value of the kind's own type.
def _limit_ok(v: bytes) -> bool:
    return v.isdigit() and int(v) < 2**63


def _count_ok(v: bytes) -> bool:
    return v.isdigit() and int(v) < 2**63


def _bucket_ok(h: dict[bytes, bytes]) -> bool:
    present = [h.get(f) for f in (b"tat", b"interval", b"burst")]
    if None in present:
        return True  # no bucket: nothing to read
    numbers = [*present, h.get(b"limited", b"0")]
    ok = all(n is not None and n.lstrip(b"-").isdigit() for n in numbers)
    return ok and int(present[2] or b"0") >= 1 and all(abs(int(n or b"0")) < 2**63 for n in numbers)


# The metrics fields the history reader adds up ("h99" is no bucket: left alone).
_COUNTED = {f"{kind}:{TYPE}".encode() for kind in ("p", "f", "r", "a", "us", "h3")}

USABLE = {
    "limit": ("string", lambda r, k: _limit_ok(r.get(k))),
    "ordered": ("string", lambda r, k: r.get(k) == b"1"),
    "rate": ("hash", lambda r, k: _bucket_ok(r.hgetall(k))),
    "type_rate": ("hash", lambda r, k: _bucket_ok(r.hgetall(k))),
    "metrics": (
        "hash",
        lambda r, k: all(_count_ok(v) for f, v in r.hgetall(k).items() if f in _COUNTED),
    ),
    "workflow": ("hash", lambda r, k: True),
    "progress": ("hash", lambda r, k: True),
    "events": ("stream", lambda r, k: True),
}


def _unusable(
    r: sync_redis.Redis, plan: dict[str, tuple[str, Any]], targets: dict[str, list[str]]
) -> set[str]:
    """The damaged keys that still hold, after the readers ran, what a reader cannot use."""
    out = set()
    for kind in plan:
        if kind not in USABLE:
            continue
        natural, usable = USABLE[kind]
        for n, key in enumerate(targets[kind]):
            if kind == "progress" and not r.exists(keys.task_key(Q, f"t{n}")):
                continue  # the task is done and gone: no reader reads its progress
            held = r.type(key).decode()
            if held != "none" and (held != natural or not usable(r, key)):
                out.add(key)
    return out


def _stranded(r: sync_redis.Redis) -> set[str]:
    """Ids in active whose lease is missing or not a finite number."""
    out = set()
    for raw in r.lrange(keys.active_key(Q), 0, -1):
        score = r.zscore(keys.lease_key(Q), raw)
        if score is None or not math.isfinite(score):
            out.add(raw.decode(errors="replace"))
    return out


async def _read_everything(url: str) -> None:
    """Every reader of asyncq's keys once; each must answer (a warning is fine)."""
    async with Inspector(url) as insp:
        await insp.queues()
        await insp.queue_info(Q)
        await insp.limit(Q)
        await insp.ordered(Q)
        await insp.type_rates()
        await insp.type_rate(TYPE)
        await insp.servers()
        await insp.metrics_history()
        for state in ("active", "pending", "completed"):
            await insp.list_tasks(Q, state)
        for n in range(TASKS):
            try:
                await insp.get_task(Q, f"t{n}")
            except Exception as exc:  # done and deleted: not found is the only answer
                assert "not found" in str(exc).lower(), exc
        # A damaged record of another type reads as none (the log names it).
        with contextlib.suppress(WorkflowNotFoundError):
            await insp.get_workflow(Q, WORKFLOW)
        await insp.workflows()
        await recent_events(insp.redis, count=100)
    app = create_app(url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as web,
    ):
        for path in (
            "/api/queues",
            f"/api/queues/{Q}",
            "/api/stats",
            "/api/type-rates",
            "/api/servers",
            "/api/events",
            "/api/history",
            "/api/workflows",
            f"/api/queues/{Q}/tasks?state=active",
            f"/api/queues/{Q}/tasks?state=completed",
            "/metrics",
            "/",
            f"/queues/{Q}",
            "/events",
            "/history",
        ):
            resp = await web.get(path)
            assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])


def _cli(url: str, home: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "120", "HOME": str(home), "ASYNCQ_REDIS_URL": None})
    for args in (["stats"], ["queue", "ls"], ["cron", "ls"], ["metrics", "top"]):
        result = runner.invoke(main, ["-u", url, *args])
        assert result.exit_code == 0, (args, result.output[-800:], result.exception)


async def _run(url: str, plan: dict[str, tuple[str, Any]], home: Path) -> dict[str, Any]:
    r = sync_redis.Redis.from_url(url)
    ran: list[str] = []

    async def handle(task: Task) -> None:
        progress(0.5, "half")
        ran.append(task.id or "")

    server = Server(
        url,
        concurrency=2,
        queues={Q: 1},
        lease_duration=timedelta(seconds=LEASE),
        limits=Limits(type_rate_limits={TYPE: "1000/s"}),
        events=True,
        intervals=Intervals(
            task_check=timedelta(milliseconds=50),
            delayed_task_check=timedelta(milliseconds=50),
            heartbeat=timedelta(milliseconds=200),
            recoverer=timedelta(milliseconds=100),
        ),
        shutdown_timeout=timedelta(seconds=2),
    )
    await server.start(handle)
    acked: list[str] = []
    refused: list[str] = []
    targets = _targets(server, int(time.time()) // 60)
    try:
        async with Client(url) as client:
            # A workflow record to damage, and the worker's delivery armed (the
            # waiters list holds its member) before the damage lands.
            await client.enqueue(Task(TYPE, b"warm"), queue=Q, task_id="warm")
            await wait_until(
                lambda: "warm" in ran and r.llen(keys.waiters_key(Q)),
                within=30,
                what="the worker waiting for work",
            )
            r.hset(targets["workflow"][0], mapping={"state": "running", "stages": "0"})
            for kind, (rtype, contents) in plan.items():
                for key in targets[kind]:
                    _write(r, key, rtype, contents)
            for n in range(TASKS):
                tid = f"t{n}"
                try:
                    await client.enqueue(Task(TYPE, b"p"), queue=Q, task_id=tid)
                    acked.append(tid)
                except Exception as exc:  # refused: must be said, and leave nothing
                    refused.append(f"{tid}: {exc!r}")
                    assert not r.exists(keys.task_key(Q, tid)), (tid, exc)
            # Work runs, or a damaged value holds it; either way, within the lease + 5 s
            # nothing may sit in active without a lease that can expire.
            with contextlib.suppress(AssertionError):  # held: checked below
                await wait_until(lambda: set(acked) <= set(ran), within=LEASE + 5, interval=0.05)
            stuck = _stranded(r)
            await wait_until(
                lambda: not stuck & _stranded(r),
                within=LEASE + 5,
                interval=0.05,
                what=f"stranded tasks {sorted(stuck)} recovered under {plan}",
            )
            await _read_everything(url)
            await asyncio.to_thread(_cli, url, home)
            unusable = _unusable(r, plan, targets)
            # The damage removed, every acknowledged task runs: none was lost.
            for kind in plan:
                for key in targets[kind]:
                    r.delete(key)
            await wait_until(
                lambda: set(acked) <= set(ran),
                within=30,
                interval=0.05,
                what=f"acknowledged enqueues run once the damage {plan} is removed",
            )
    finally:
        await server.shutdown()
        r.close()
    return {
        "unusable": unusable,
        "refused": refused,
        "restarts": server.stats.role_restarts,
        "targets": targets,
    }


@FUZZ
@given(plan=plans())
def test_damaged_asyncq_keys_strand_nothing_lose_nothing_and_fail_no_reader(
    redis_url: str, r: sync_redis.Redis, tmp_path: Path, plan: dict[str, tuple[str, Any]]
) -> None:
    r.flushdb()
    with capture_logs() as logs:
        out = asyncio.run(_run(redis_url, plan, tmp_path))
    assert not out["refused"], out["refused"]
    assert not out["restarts"], (out["restarts"], plan)
    crashed = [e for e in logs if "crash" in str(e.get("event", ""))]
    assert not crashed, crashed
    # An error a damaged value causes names its key (a dequeue refusing a limit of another
    # type, say); an unnamed one (a worker failing its own bookkeeping) is a defect.
    damaged = [key for kind in plan for key in out["targets"][kind]]
    errors = [e for e in logs if e.get("log_level") in ("error", "critical")]
    unnamed = [e for e in errors if not any(k in repr(e) for k in damaged)]
    assert not unnamed, (unnamed[:3], plan)
    warned = {str(e.get("key")) for e in logs if e.get("log_level") in ("warning", "error")}
    assert out["unusable"] <= warned, (sorted(out["unusable"] - warned), plan)


# Defects in scripts other engineers are changing now (enqueue.lua, dequeue_queues.lua):
# the reproductions stay here, strict, so that the fix turns them green; the fix for
# each is in the issue 39 note.


async def _serve_and_enqueue(
    url: str, damage: Any, *, queues: dict[str, int], **options: Any
) -> tuple[list[str], list[str]]:
    """Start a worker, apply *damage(redis, server)*, enqueue one task to each queue;
    the ids that ran within the lease + 5 s, and the enqueues refused."""
    r = sync_redis.Redis.from_url(url)
    ran: list[str] = []
    refused: list[str] = []

    async def handle(task: Task) -> None:
        ran.append(task.id or "")

    server = Server(
        url,
        concurrency=2,
        queues=queues,
        lease_duration=timedelta(seconds=LEASE),
        intervals=Intervals(
            task_check=timedelta(milliseconds=50),
            heartbeat=timedelta(milliseconds=200),
            recoverer=timedelta(milliseconds=100),
        ),
        shutdown_timeout=timedelta(seconds=2),
        **options,
    )
    await server.start(handle)
    try:
        async with Client(url) as client:
            first = next(iter(queues))
            await client.enqueue(Task(TYPE), queue=first, task_id="warm")
            # A worker with rate limits is not armed for delivery: then "warm" is enough.
            armed = "limits" not in options
            await wait_until(
                lambda: "warm" in ran and (not armed or r.llen(keys.waiters_key(first))),
                within=30,
                what="the worker waiting for work",
            )
            damage(r, server)
            for q in queues:
                try:
                    await client.enqueue(Task(TYPE), queue=q, task_id=f"in-{q}")
                except Exception as exc:
                    refused.append(repr(exc))
            with contextlib.suppress(AssertionError):
                await wait_until(lambda: all(f"in-{q}" in ran for q in queues), within=LEASE + 5)
    finally:
        await server.shutdown()
        r.close()
    return ran, refused


@pytest.mark.parametrize("credit", [b"inf", b"1.5", b"1e3"])
def test_a_garbage_delivery_credit_never_fails_an_enqueue(
    redis_url: str, r: sync_redis.Redis, credit: bytes
) -> None:
    def damage(r: sync_redis.Redis, server: Server) -> None:
        r.set(keys.delivery_channel(server.server_id), credit)

    ran, refused = asyncio.run(_serve_and_enqueue(redis_url, damage, queues={Q: 1}))
    assert not refused, refused
    assert ran.count(f"in-{Q}") == 1, ran


@pytest.mark.parametrize("tat", [b"nan", b"inf"])
def test_a_garbage_queue_rate_bucket_holds_no_other_queue_and_is_reset(
    redis_url: str, r: sync_redis.Redis, tat: bytes
) -> None:
    def damage(r: sync_redis.Redis, server: Server) -> None:
        r.hset(keys.rate_key(Q), mapping={"tat": tat, "interval": "1000", "burst": "5"})

    ran, refused = asyncio.run(
        _serve_and_enqueue(
            redis_url, damage, queues={Q: 1, "other": 1}, limits=Limits(rate_limits={Q: "1000/s"})
        )
    )
    assert not refused, refused
    assert {f"in-{Q}", "in-other"} <= set(ran), ran
