"""Client.enqueue_many routes every item exactly as Client.enqueue does; Client on a Connection."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

import asyncq._producer.compose as compose_module
from asyncq import _keys as keys
from asyncq._producer.client import Client
from asyncq._redis.connection import Connection
from asyncq._scheduling.scheduler import Scheduler
from asyncq.errors import DuplicateTaskError, TaskIdConflictError
from asyncq.task import EnqueueOptions, Task, TaskInfo, TaskState
from tests.support.helpers import pexpiretime

Item = Task | tuple[Task, dict[str, Any]]


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(params=["redis-py", "fast"])
def target(request: pytest.FixtureRequest, redis: Redis, redis_url: str) -> Redis | str:
    """A shared redis-py client (pipelines through redis-py) or a URI (the fast transport)."""
    return redis if request.param == "redis-py" else redis_url


@pytest.fixture
def reset_ids(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Deterministic generated task IDs, restarted by the returned function before each run."""
    counter: list[Iterator[int]] = [itertools.count()]

    def fake() -> str:
        return f"auto-{next(counter[0])}"

    # compose (the general path) and Template.encode (the hot path) both take ids there
    monkeypatch.setattr(compose_module, "new_task_id", fake)

    def reset() -> None:
        counter[0] = itertools.count()

    return reset


# -- the reference: the same tasks enqueued one by one ----------------------------------------


def flatten(task_options: Mapping[str, Any], common: Mapping[str, Any]) -> dict[str, Any]:
    """*common* overlaid with an item's own options, as enqueue_many documents it."""
    given = {k: v for k, v in task_options.items() if v is not None}
    merged = {k: v for k, v in common.items() if v is not None}
    if "process_at" in given or "process_in" in given:
        merged.pop("process_at", None)
        merged.pop("process_in", None)
    headers = {**merged.pop("headers", {}), **given.pop("headers", {})}
    merged.update(given)
    if headers:
        merged["headers"] = headers
    return merged


async def one_by_one(
    target: Redis | str, items: Sequence[Item], common: Mapping[str, Any]
) -> list[TaskInfo | Exception]:
    results: list[TaskInfo | Exception] = []
    async with Client(target) as client:
        for item in items:
            task, own = item if isinstance(item, tuple) else (item, {})
            try:
                results.append(await client.enqueue(task, **flatten(own, common)))
            except (ValueError, TypeError, DuplicateTaskError, TaskIdConflictError) as exc:
                results.append(exc)
    return results


async def batched(
    target: Redis | str, items: Sequence[Item], common: Mapping[str, Any]
) -> list[TaskInfo | Exception]:
    async with Client(target) as client:
        opts: EnqueueOptions = dict(common)  # type: ignore[assignment]
        return await client.enqueue_many(cast(Sequence[Any], items), **opts)


@dataclass(frozen=True, slots=True)
class KeyState:
    kind: str
    value: Any
    expire_ms: int  # absolute unix ms (PEXPIRETIME); -1 when the key does not expire


async def snapshot(redis: Redis) -> dict[bytes, KeyState]:
    out: dict[bytes, KeyState] = {}
    async for key in redis.scan_iter(count=1000):
        kind = cast(bytes, await redis.type(key)).decode()
        value: Any
        if kind == "string":
            value = await redis.get(key)
        elif kind == "hash":
            value = await redis.hgetall(key)
        elif kind == "list":
            value = await redis.lrange(key, 0, -1)
        elif kind == "zset":
            value = dict(
                cast(list[tuple[bytes, float]], await redis.zrange(key, 0, -1, withscores=True))
            )
        elif kind == "set":
            value = await redis.smembers(key)
        else:
            raise AssertionError(f"unexpected {kind} key {key!r}")
        out[key] = KeyState(kind, value, await pexpiretime(redis, key))
    return out


def assert_same_state(
    expected: dict[bytes, KeyState], actual: dict[bytes, KeyState], gap: float
) -> None:
    """Equal keys, types, values and expiries.

    Clock-derived numbers of the second run are later by at most *gap*, the
    seconds between the two runs' starts; whole-second values (scores, lock
    TTLs) may also differ by the one second their truncation loses.
    """
    assert sorted(actual) == sorted(expected)
    gap_ns = int(gap * 1e9) + 1_000_000
    for key, want in expected.items():
        got = actual[key]
        assert got.kind == want.kind, key
        if want.kind == "hash":
            want_fields, got_fields = dict(want.value), dict(got.value)
            want_since = want_fields.pop(b"pending_since", None)
            got_since = got_fields.pop(b"pending_since", None)
            assert (want_since is None) == (got_since is None), key
            if want_since is not None and got_since is not None:
                assert 0 <= int(got_since) - int(want_since) <= gap_ns, key
            assert got_fields == want_fields, key
        elif want.kind == "zset":
            # Scores are unix seconds (scheduled at, added to group); a run may cross a second.
            assert got.value.keys() == want.value.keys(), key
            for member, score in want.value.items():
                assert abs(got.value[member] - score) <= gap + 1, (key, member)
        else:
            assert got.value == want.value, key
        if want.expire_ms < 0:
            assert got.expire_ms == want.expire_ms, key
        else:
            assert abs(got.expire_ms - want.expire_ms) <= (gap + 1) * 1000 + 1, key


def assert_same_results(
    expected: Sequence[TaskInfo | Exception], actual: Sequence[TaskInfo | Exception], gap: float
) -> None:
    assert len(actual) == len(expected)
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if isinstance(want, Exception):
            assert type(got) is type(want), (i, want, got)
            assert str(got) == str(want), i
            continue
        assert isinstance(got, TaskInfo), (i, want, got)
        assert want.next_process_at is not None or got.next_process_at is None, i
        if want.next_process_at is not None:
            assert got.next_process_at is not None, i
            slack = timedelta(seconds=gap + 1)
            assert abs(got.next_process_at - want.next_process_at) <= slack, i
        assert replace(got, next_process_at=None) == replace(want, next_process_at=None), i


async def assert_batch_matches_enqueue(
    redis: Redis,
    target: Redis | str,
    reset_ids: Callable[[], None],
    items: Sequence[Item],
    common: Mapping[str, Any] | None = None,
    before: Callable[[Redis], Any] | None = None,
) -> list[TaskInfo | Exception]:
    """Run *items* one by one, snapshot, flush, run them as a batch; assert both agree."""
    common = common or {}
    await redis.flushdb()
    if before is not None:
        await before(redis)
    reset_ids()
    started = time.time()
    expected = await one_by_one(target, items, common)
    expected_state = await snapshot(redis)
    await redis.flushdb()
    if before is not None:
        await before(redis)
    reset_ids()
    actual = await batched(target, items, common)
    # Every clock value of the second run lies within this many seconds after its
    # counterpart of the first: a bound from observed times, not a margin.
    gap = time.time() - started
    assert_same_results(expected, actual, gap)
    assert_same_state(expected_state, await snapshot(redis), gap)
    return actual


# -- every route ------------------------------------------------------------------------------

FUTURE = timedelta(minutes=5)
UNIQUE = timedelta(minutes=10)


def _future_at() -> datetime:
    return datetime.now(UTC) + FUTURE


ROUTES: dict[str, tuple[Callable[[], dict[str, Any]], TaskState]] = {
    "pending": (dict, TaskState.PENDING),
    "unique": (lambda: {"unique": UNIQUE}, TaskState.PENDING),
    "process_in": (lambda: {"process_in": FUTURE}, TaskState.SCHEDULED),
    "process_at": (lambda: {"process_at": _future_at()}, TaskState.SCHEDULED),
    "process_in+unique": (lambda: {"process_in": FUTURE, "unique": UNIQUE}, TaskState.SCHEDULED),
    "process_at+unique": (
        lambda: {"process_at": _future_at(), "unique": UNIQUE},
        TaskState.SCHEDULED,
    ),
    "group": (lambda: {"group": "g"}, TaskState.AGGREGATING),
    "group+unique": (lambda: {"group": "g", "unique": UNIQUE}, TaskState.AGGREGATING),
    "group+process_in": (lambda: {"group": "g", "process_in": FUTURE}, TaskState.SCHEDULED),
    "group+process_at+unique": (
        lambda: {"group": "g", "process_at": _future_at(), "unique": UNIQUE},
        TaskState.SCHEDULED,
    ),
    "group+past process_at": (
        lambda: {"group": "g", "process_at": datetime.now(UTC) - FUTURE},
        TaskState.AGGREGATING,
    ),
    "unique+zero process_in": (
        lambda: {"unique": UNIQUE, "process_in": timedelta(0)},
        TaskState.PENDING,
    ),
}


@pytest.mark.parametrize("route", list(ROUTES))
async def test_each_route_matches_enqueue(
    redis: Redis, target: Redis | str, reset_ids: Callable[[], None], route: str
) -> None:
    make_options, state = ROUTES[route]
    options = make_options()
    items: list[Item] = [
        (Task("email", f"{i}".encode()), {**options, "queue": q})
        for i, q in enumerate(["default", "low", "default", "low"])
    ]
    items.append((Task("email", b"explicit"), {**options, "task_id": "explicit"}))
    results = await assert_batch_matches_enqueue(redis, target, reset_ids, items)
    assert all(isinstance(r, TaskInfo) and r.state is state for r in results)

    first = results[0]
    assert isinstance(first, TaskInfo)
    fields = await redis.hgetall(keys.task_key("default", first.id))
    assert fields[b"state"] == state.value.encode()
    if "unique" in options:
        lock = keys.unique_key("default", "email", b"0")
        assert await redis.get(lock) == first.id.encode()
        lock_ttl = UNIQUE + (FUTURE if state is TaskState.SCHEDULED else timedelta(0))
        remaining = timedelta(milliseconds=await redis.pttl(lock))
        # Scheduled: until it is due plus the uniqueness period (asynq's ScheduleUnique).
        assert lock_ttl - timedelta(seconds=5) < remaining <= lock_ttl


async def test_common_options_route_every_item(
    redis: Redis, target: Redis | str, reset_ids: Callable[[], None]
) -> None:
    items: list[Item] = [
        Task("a", b"1"),
        (Task("b", b"2"), {"group": None}),  # None: "not set", the common group stays
        (Task("c", b"3"), {"process_in": FUTURE}),  # scheduling wins over the common group
        (Task("d", b"4"), {"process_at": datetime.now(UTC) - FUTURE}),  # past: still grouped
        Task("e", b"5", queue="low"),
    ]
    common = {"group": "batch", "unique": UNIQUE, "headers": {"via": "many"}}
    results = await assert_batch_matches_enqueue(redis, target, reset_ids, items, common)
    states = [r.state if isinstance(r, TaskInfo) else r for r in results]
    assert states == [
        TaskState.AGGREGATING,
        TaskState.AGGREGATING,
        TaskState.SCHEDULED,
        TaskState.AGGREGATING,
        TaskState.AGGREGATING,
    ]
    assert await redis.zcard(keys.group_key("default", "batch")) == 3
    assert await redis.smembers(keys.all_groups("low")) == {b"batch"}


# -- duplicates and conflicts inside one batch ------------------------------------------------


@pytest.mark.parametrize("route", ["unique", "process_in+unique", "group+unique"])
async def test_duplicate_inside_one_batch_first_wins(
    redis: Redis, target: Redis | str, reset_ids: Callable[[], None], route: str
) -> None:
    options = ROUTES[route][0]()
    items: list[Item] = [
        (Task("report", b"same"), {**options, "task_id": "first"}),
        (Task("report", b"same"), {**options, "task_id": "second"}),
        (Task("report", b"other"), {**options, "task_id": "third"}),
    ]
    results = await assert_batch_matches_enqueue(redis, target, reset_ids, items)
    first, second, third = results
    assert isinstance(first, TaskInfo) and first.id == "first"
    assert isinstance(second, DuplicateTaskError)
    assert isinstance(third, TaskInfo)
    assert await redis.get(keys.unique_key("default", "report", b"same")) == b"first"
    assert not await redis.exists(keys.task_key("default", "second"))


async def test_lock_held_before_the_batch(
    redis: Redis, target: Redis | str, reset_ids: Callable[[], None]
) -> None:
    lock = keys.unique_key("default", "report", b"held")

    async def hold(r: Redis) -> None:
        await r.set(lock, "someone", ex=600)

    items: list[Item] = [
        (Task("report", b"held"), {"unique": UNIQUE}),
        (Task("report", b"held"), {"unique": UNIQUE, "group": "g"}),
        (Task("report", b"held"), {"unique": UNIQUE, "process_in": FUTURE}),
        (Task("report", b"free"), {"unique": UNIQUE}),
    ]
    results = await assert_batch_matches_enqueue(redis, target, reset_ids, items, before=hold)
    assert [type(r) for r in results] == [DuplicateTaskError] * 3 + [TaskInfo]
    assert await redis.get(lock) == b"someone"


async def test_same_task_id_twice_in_one_batch(
    redis: Redis, target: Redis | str, reset_ids: Callable[[], None]
) -> None:
    items: list[Item] = [
        (Task("a"), {"task_id": "dup", "group": "g"}),
        (Task("b"), {"task_id": "dup"}),
        (Task("c", b"x"), {"task_id": "dup", "unique": UNIQUE}),
        (Task("d"), {"task_id": "dup", "process_in": FUTURE}),
    ]
    results = await assert_batch_matches_enqueue(redis, target, reset_ids, items)
    assert isinstance(results[0], TaskInfo)
    assert all(isinstance(r, TaskIdConflictError) for r in results[1:])
    # As in asynq, a unique write that hits an existing ID keeps the lock it took.
    assert await redis.get(keys.unique_key("default", "c", b"x")) == b"dup"


# -- invalid items keep their positions -------------------------------------------------------


async def test_mixed_valid_and_invalid_items_keep_their_positions(
    redis: Redis, target: Redis | str, reset_ids: Callable[[], None]
) -> None:
    far = datetime(9999, 12, 31, tzinfo=UTC)
    items: list[Item] = [
        (Task("ok", b"1"), {"unique": UNIQUE}),
        (Task("bad"), {"unique": timedelta(milliseconds=500)}),
        (Task("ok", b"2"), {"group": "g"}),
        (Task("bad"), {"group": " "}),
        (Task("ok", b"3"), {"process_in": FUTURE, "unique": UNIQUE, "group": "g"}),
        (Task("bad"), {"process_at": datetime(2030, 1, 1)}),  # naive
        (Task("bad"), {"unique": 60}),
        (Task("bad"), {"process_at": far, "unique": timedelta.max}),  # lock TTL overflows
        (Task("ok", b"1"), {"unique": UNIQUE}),  # duplicate of the first
        (Task("bad"), {"process_at": _future_at(), "process_in": FUTURE}),
        (Task("ok", b"4"), {"group": "g", "unique": UNIQUE, "queue": "low"}),
    ]
    results = await assert_batch_matches_enqueue(redis, target, reset_ids, items)
    kinds = [type(r) for r in results]
    assert kinds == [
        TaskInfo,
        ValueError,
        TaskInfo,
        ValueError,
        TaskInfo,
        ValueError,
        TypeError,
        ValueError,
        DuplicateTaskError,
        ValueError,
        TaskInfo,
    ]
    messages = [str(r) for r in results if not isinstance(r, TaskInfo)]
    assert "Unique TTL cannot be less than 1s" in messages[0]
    assert "group key cannot be empty" in messages[1]
    assert "timezone-aware" in messages[2]
    assert "unique must be a datetime.timedelta" in messages[3]
    assert "unique is too long" in messages[4]
    assert "process_at or process_in, not both" in messages[6]
    written = {r.id.encode() for r in results if isinstance(r, TaskInfo)}
    task_keys = cast(list[bytes], await redis.keys("asynq:{*}:t:*"))
    assert {k.rsplit(b":", 1)[1] for k in task_keys} == written


async def test_far_future_unique_schedule_in_a_batch(redis: Redis) -> None:
    at = datetime(9999, 12, 31, tzinfo=UTC)
    async with Client(redis) as client:
        (info,) = await client.enqueue_many(
            [(Task("t", b"far"), {"unique": timedelta(days=1)})], process_at=at
        )
    assert isinstance(info, TaskInfo) and info.state is TaskState.SCHEDULED
    assert await redis.ttl(keys.unique_key("default", "t", b"far")) > 10**11


# -- random mixes -----------------------------------------------------------------------------

_TIMING: st.SearchStrategy[dict[str, Any]] = st.sampled_from(
    [
        {},
        {"process_in": timedelta(0)},
        {"process_in": timedelta(seconds=30)},
        {"process_at": "past"},
        {"process_at": "future"},
    ]
)


@st.composite
def option_sets(draw: st.DrawFn, *, invalid: bool) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for name, values in (
        ("queue", [None, "default", "low"]),
        ("unique", [None, timedelta(seconds=90), UNIQUE]),
        ("group", [None, "g1", "g2"]),
        ("task_id", [None, None, "id-0", "id-1"]),
        ("retention", [None, timedelta(hours=1)]),
    ):
        value = draw(st.sampled_from(values))
        if value is not None:
            opts[name] = value
    opts.update(draw(_TIMING))
    if invalid and draw(st.integers(0, 9)) == 0:
        opts.update(
            draw(
                st.sampled_from(
                    [
                        {"unique": timedelta(milliseconds=10)},
                        {"group": ""},
                        {"queue": "  "},
                        {"process_in": timedelta(seconds=-1)},
                        {"max_retry": -1},
                    ]
                )
            )
        )
    return opts


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[tuple[str, bytes, dict[str, Any]]], dict[str, Any]]:
    n = draw(st.integers(1, 10))
    raw = [
        (
            draw(st.sampled_from(["a", "b"])),
            draw(st.sampled_from([b"p", b"q", b"r"])),  # few payloads: unique locks collide
            draw(option_sets(invalid=True)),
        )
        for _ in range(n)
    ]
    return raw, draw(option_sets(invalid=False))


def _materialize(opts: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    out = dict(opts)
    if out.get("process_at") == "past":
        out["process_at"] = now - timedelta(minutes=1)
    elif out.get("process_at") == "future":
        out["process_at"] = now + timedelta(minutes=1)
    return out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=batches())
async def test_random_mixes_match_enqueue(
    redis: Redis,
    target: Redis | str,
    reset_ids: Callable[[], None],
    batch: tuple[list[tuple[str, bytes, dict[str, Any]]], dict[str, Any]],
) -> None:
    raw, common = batch
    now = datetime.now(UTC)
    items: list[Item] = [(Task(t, p), _materialize(o, now)) for t, p, o in raw]
    await assert_batch_matches_enqueue(redis, target, reset_ids, items, _materialize(common, now))


# -- a Client on an existing Connection -------------------------------------------------------


async def test_client_shares_a_connection_and_its_fast_transport(
    redis: Redis, redis_url: str
) -> None:
    async with Connection(redis_url) as conn:
        assert conn.fast is not None
        client = Client(conn)
        assert client.broker.fast is conn.fast
        assert client.redis is conn.redis
        info = await client.enqueue(Task("t"))
        await client.aclose()
        assert client.closed and not conn.closed
        with pytest.raises(RuntimeError, match="closed"):
            await client.enqueue(Task("t"))
        async with Client(conn) as again:  # the connection still works for others
            batch = await again.enqueue_many([Task("u")])
        assert isinstance(batch[0], TaskInfo)
        assert not conn.closed
        third = Client(conn)
    assert third.closed  # its owner closed the connection
    with pytest.raises(RuntimeError, match="closed"):
        await third.enqueue(Task("t"))
    with pytest.raises(RuntimeError, match="connection is closed"):
        Client(conn)
    assert await redis.exists(keys.task_key("default", info.id))


async def test_scheduler_enqueues_through_its_connection(redis: Redis, redis_url: str) -> None:
    scheduler = Scheduler(redis_url, heartbeat_interval=timedelta(seconds=1))
    scheduler.register("@every 1s", Task("tick"))
    async with scheduler:
        conn = scheduler._conn
        assert conn is not None and conn.fast is not None
        assert scheduler._client is not None and scheduler._client.broker.fast is conn.fast
        assert scheduler._broker is not None and scheduler._broker.fast is conn.fast
        deadline = time.monotonic() + 15
        while not await redis.llen(keys.pending_key("default")):
            assert time.monotonic() < deadline, "the scheduler enqueued nothing"
            await asyncio.sleep(0.05)
    assert conn.closed
