"""Failure triage: the error-signature normaliser, error groups and the bulk actions per group."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import Client, ErrorGroup, ErrorReport, Task, chord
from asyncq import _keys as keys
from asyncq._broker import triage as triage_mod
from asyncq._codec import decode_task_message, encode_task_message
from asyncq._errsig import MAX_MESSAGE, error_signature, normalise_message, split_error
from asyncq._inspection.inspector import Inspector
from asyncq._logging import error_text
from asyncq.cli import main
from asyncq.errors import BrokerError, QueueNotFoundError
from asyncq.task import TaskState
from tests.support import gofixtures as go
from tests.support.gofixtures import GoTask
from tests.support.triage import CONN, DIAL, KEYERR, NOW, VALUE, seed_mixed

# -- the normaliser (pure) ----------------------------------------------------------------------

_WORDS = st.sampled_from(
    ["failed", "connecting", "to", "order", "not", "found", "timeout", "user", "at", "ok", "db"]
)
_octet = st.integers(0, 255)
_VARYING = {
    "number": st.one_of(
        st.integers(-(10**12), 10**12).map(str),
        st.floats(0, 1e6, allow_nan=False).map(lambda f: f"{f:.3f}"),
    ),
    "uuid": st.uuids().map(str),
    "ip": st.tuples(_octet, _octet, _octet, _octet, st.none() | st.integers(1, 65535)).map(
        lambda t: ".".join(map(str, t[:4])) + ("" if t[4] is None else f":{t[4]}")
    ),
    "hex": st.one_of(
        st.integers(0, 2**64).map(hex),
        st.binary(min_size=4, max_size=20).map(lambda b: b.hex() + "a0"),
    ),
    "quoted": st.text(st.characters(exclude_characters="'\n\r"), max_size=12).map(
        lambda s: f"'{s}'"
    ),
}
_TEMPLATE = st.lists(
    st.one_of(
        _WORDS.map(lambda w: ("word", w)),
        st.sampled_from(sorted(_VARYING)).map(lambda k: ("slot", k)),
    ),
    min_size=1,
    max_size=10,
)


@st.composite
def two_fillings(draw: st.DrawFn) -> tuple[str, str]:
    """One template (words and varying slots) filled twice with independent values."""
    template = draw(_TEMPLATE)
    out = []
    for _ in range(2):
        parts = [v if kind == "word" else draw(_VARYING[v]) for kind, v in template]
        out.append(" ".join(parts))
    return out[0], out[1]


@settings(deadline=None)  # a busy machine must not fail a pure function
@given(two_fillings())
def test_messages_differing_only_in_folded_parts_normalise_equal(pair: tuple[str, str]) -> None:
    a, b = pair
    assert normalise_message(a) == normalise_message(b)
    # Nothing that varied survives: the words had no digits, so neither does the result.
    assert not any(c.isdigit() for c in normalise_message(a))


@settings(deadline=None)  # a busy machine must not fail a pure function
@given(st.text(max_size=400))
def test_normalise_is_idempotent_and_bounded(text: str) -> None:
    once = normalise_message(text)
    assert normalise_message(once) == once
    assert len(once) <= MAX_MESSAGE
    assert once == once.strip()
    assert "  " not in once


_CLASS = st.from_regex(r"\A(?:[a-z_][a-z0-9_]{0,8}\.){0,2}[A-Z][A-Za-z0-9_]{0,15}\Z")


@settings(deadline=None)  # a busy machine must not fail a pure function
@given(_CLASS, st.text(st.characters(exclude_categories=("Cc", "Zs", "Zl", "Zp")), max_size=40))
def test_split_error_takes_the_exception_class(name: str, message: str) -> None:
    assert split_error(f"{name}: {message}") == (name, message.strip())
    assert split_error(name) == (name, "")


def test_error_text_of_a_python_exception_has_its_type() -> None:
    sig = error_signature(error_text(ValueError("order 4711 not found")))
    assert (sig.kind, sig.message) == ("ValueError", "order <n> not found")


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        (
            "ConnectionError: Error 111 connecting to 10.0.0.12:6379. Connection refused.",
            "ConnectionError",
            "Error <n> connecting to <ip>. Connection refused.",
        ),
        ("KeyError: 'user_42'", "KeyError", "'<str>'"),
        (
            "httpx.ConnectTimeout: timed out after 30.5s",
            "httpx.ConnectTimeout",
            "timed out after <n>s",
        ),
        (
            "dial tcp [::1]:6379: connect: connection refused",
            "",
            "dial tcp <ip>: connect: connection refused",
        ),
        (
            "task 3f2504e0-4f89-11d3-9a0c-0305e82c3301 failed at 0xdeadbeef",
            "",
            "task <uuid> failed at <hex>",
        ),
        ("""can't reach "db-1" at fe80::1ff:fe23:4567:890a""", "", "can't reach '<str>' at <ip>"),
        ("HTTP2 stream 7 reset", "", "HTTP2 stream <n> reset"),
        ("asynq: task canceled", "", "asynq: task canceled"),
        ("RuntimeError", "RuntimeError", ""),
        ("sha 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b mismatch", "", "sha <hex> mismatch"),
        ("ValueError:   two\n  lines  ", "ValueError", "two lines"),
    ],
)
def test_signature_examples(error: str, kind: str, message: str) -> None:
    sig = error_signature(error)
    assert (sig.kind, sig.message) == (kind, message)
    assert len(sig.key) == 12 and int(sig.key, 16) >= 0
    assert sig.key == error_signature(error).key


def test_signature_keys_differ_by_type_and_message() -> None:
    keys = {
        error_signature(e).key
        for e in ("ValueError: x", "KeyError: x", "ValueError: y", "ValueError", "x")
    }
    assert len(keys) == 5


# -- error groups on Redis ----------------------------------------------------------------------


@pytest.fixture
async def insp(redis: Redis) -> AsyncIterator[Inspector]:
    inspector = Inspector(redis, clock=NOW.timestamp)
    async with inspector:
        yield inspector


def _at(minutes: int) -> int:
    return go.unix(NOW - timedelta(minutes=minutes))


def _by_key(report: ErrorReport) -> dict[str, ErrorGroup]:
    return {g.key: g for g in report.groups}


async def test_groups_count_exactly(redis: Redis, insp: Inspector) -> None:
    made = await seed_mixed(redis)
    report = await insp.error_groups()
    assert (report.scanned, report.total, report.capped) == (20, 20, False)
    assert [g.count for g in report.groups] == [9, 5, 3, 2, 1]
    groups = _by_key(report)
    conn = groups[CONN.key]
    assert (conn.kind, conn.message) == (
        "ConnectionError",
        "Error <n> connecting to <ip>. Connection refused.",
    )
    assert conn.signature == "ConnectionError: Error <n> connecting to <ip>. Connection refused."
    assert conn.queues == {"default": 7, "critical": 2}
    assert conn.task_types == {"email": 6, "sms": 3}
    assert conn.states == {"archived": 6, "retry": 3}
    assert conn.first_seen == NOW - timedelta(minutes=31)
    assert conn.last_seen == NOW - timedelta(minutes=2)
    assert conn.example == made["conn"][4].error_msg  # the newest failure's text
    assert conn.sample[0] == ("default", made["conn"][4].id)
    assert len(conn.sample) == 5
    key = groups[KEYERR.key]
    assert (key.count, key.queues, key.task_types, key.states) == (
        5,
        {"default": 5},
        {"import": 5},
        {"archived": 5},
    )
    dial = groups[DIAL.key]
    assert (dial.kind, dial.message, dial.count) == ("", "dial tcp <ip>: i/o timeout", 3)
    assert groups[VALUE.key].states == {"retry": 2}
    bad = next(g for g in report.groups if g.count == 1)
    assert (bad.message, bad.queues, bad.task_types) == (
        "undecodable task message",
        {"default": 1},
        {"": 1},
    )


async def test_groups_filtered_by_queue_and_state(redis: Redis, insp: Inspector) -> None:
    await seed_mixed(redis)
    report = await insp.error_groups("critical")
    assert {g.key: g.count for g in report.groups} == {CONN.key: 2, DIAL.key: 3}
    assert report.total == 5
    retry = await insp.error_groups(states=["retry"])
    assert {g.key: g.count for g in retry.groups} == {CONN.key: 3, VALUE.key: 2}
    with pytest.raises(QueueNotFoundError):
        await insp.error_groups(["nope"])
    with pytest.raises(ValueError, match="retry and archived"):
        await insp.error_groups(states=["pending"])
    with pytest.raises(ValueError, match="limit"):
        await insp.error_groups(limit=0)


async def test_capped_scan_reads_the_newest_and_says_so(redis: Redis, insp: Inspector) -> None:
    await redis.flushdb()
    for i in range(1234):
        t = GoTask("bulk", error_msg=f"TimeoutError: job {i} timed out", last_failed_at=_at(i))
        await go.seed_archived(redis, t, NOW - timedelta(seconds=i))
    capped = await insp.error_groups(limit=1000)
    assert (capped.scanned, capped.total, capped.capped) == (1000, 1234, True)
    assert [g.count for g in capped.groups] == [1000]
    # Newest first: the 1,000 read are those archived 0..999 seconds ago.
    assert capped.groups[0].last_seen == NOW
    full = await insp.error_groups(limit=None)
    assert (full.scanned, full.capped, full.groups[0].count) == (1234, False, 1234)


async def test_capped_scan_takes_turns_over_queues(redis: Redis, insp: Inspector) -> None:
    await redis.flushdb()
    for queue in ("alpha", "beta"):
        for i in range(700):
            t = GoTask("bulk", queue=queue, error_msg=f"{queue.title()}Error: {i}")
            await go.seed_archived(redis, t, NOW - timedelta(seconds=i))
    report = await insp.error_groups(limit=1000)
    assert (report.scanned, report.total) == (1000, 1400)
    # A chunk (500) of each queue in turn, not all of the first and the rest of the second.
    assert {g.kind: g.count for g in report.groups} == {"AlphaError": 500, "BetaError": 500}


async def _states(redis: Redis, tasks: Sequence[GoTask]) -> list[str | None]:
    out = []
    for t in tasks:
        v = await redis.hget(t.key, "state")
        out.append(None if v is None else v.decode())
    return out


async def test_run_group_moves_exactly_its_tasks(redis: Redis, insp: Inspector) -> None:
    made = await seed_mixed(redis)
    result = await insp.run_error_group(CONN.key)
    assert (result.acted, result.skipped) == (9, 0)
    assert await _states(redis, made["conn"]) == ["pending"] * 9
    pending = {m.decode() for m in await redis.lrange("asynq:{default}:pending", 0, -1)}
    assert {t.id for t in made["conn"] if t.queue == "default"} <= pending
    assert await redis.zcard("asynq:{default}:retry") == 2  # the ValueError pair
    assert await redis.zcard("asynq:{critical}:archived") == 3  # the dial errors
    assert await _states(redis, made["key"]) == ["archived"] * 5
    after = await insp.error_groups()
    assert CONN.key not in _by_key(after)
    assert after.total == 11


async def test_run_group_queues_behind_the_pending_tasks(redis: Redis, insp: Inspector) -> None:
    made = await seed_mixed(redis)
    (waiting,) = await redis.lrange("asynq:{default}:pending", 0, -1)
    result = await insp.run_error_group(VALUE.key)
    assert (result.acted, result.skipped) == (2, 0)
    # Workers take from the tail: the task already pending still runs first.
    pending = await redis.lrange("asynq:{default}:pending", 0, -1)
    assert len(pending) == 3 and pending[-1] == waiting
    # Pending from now on, as the queue latency counts it.
    for t in made["value"]:
        assert await redis.hget(t.key, "pending_since") == str(go.unix_ns(NOW)).encode()


async def test_archive_group_archives_its_retry_tasks(redis: Redis, insp: Inspector) -> None:
    made = await seed_mixed(redis)
    result = await insp.archive_error_group(CONN.key)
    assert (result.acted, result.skipped) == (3, 0)
    assert await _states(redis, made["conn"]) == ["archived"] * 9
    archived = {m.decode() for m in await redis.zrange("asynq:{default}:archived", 0, -1)}
    assert {t.id for t in made["conn"][4:7]} <= archived
    assert await redis.zscore("asynq:{default}:archived", made["conn"][4].id) == go.unix(NOW)
    assert await redis.zcard("asynq:{default}:retry") == 2
    assert _by_key(await insp.error_groups())[CONN.key].states == {"archived": 9}


async def test_delete_group_in_one_queue_releases_unique_locks(
    redis: Redis, insp: Inspector
) -> None:
    made = await seed_mixed(redis)
    result = await insp.delete_error_group(CONN.key, queues=["critical"])
    assert (result.acted, result.skipped) == (2, 0)
    assert await _states(redis, made["conn"]) == ["archived"] * 4 + ["retry"] * 3 + [None] * 2
    result = await insp.delete_error_group(VALUE.key)
    assert (result.acted, result.skipped) == (2, 0)
    for t in made["value"]:
        assert not await redis.exists(t.key)
        assert not await redis.exists(t.unique_key)
    assert await redis.zcard("asynq:{default}:retry") == 3
    groups = _by_key(await insp.error_groups())
    assert groups[CONN.key].count == 7 and VALUE.key not in groups


async def test_tasks_that_moved_meanwhile_are_skipped_and_counted(
    redis: Redis, insp: Inspector, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = await seed_mixed(redis)
    keyerr = made["key"]
    real_act = triage_mod.TriageBroker.act

    async def racing_act(
        self: triage_mod.TriageBroker,
        qname: str,
        state: TaskState,
        action: str,
        tasks: Sequence[tuple[str, str]],
    ) -> list[str]:
        # Between the read and the action: one task is run by someone else, one runs,
        # fails again with another error and is archived again, one is deleted.
        await insp.run_task("default", keyerr[0].id)
        moved = GoTask(
            "import", id=keyerr[1].id, error_msg="OSError: disk full", last_failed_at=_at(0)
        )
        await redis.hset(moved.key, "msg", moved.encode())
        await insp.delete_task("default", keyerr[2].id)
        return await real_act(self, qname, state, action, tasks)

    monkeypatch.setattr(triage_mod.TriageBroker, "act", racing_act)
    result = await insp.delete_error_group(KEYERR.key)
    assert (result.acted, result.skipped) == (2, 3)
    assert await _states(redis, keyerr) == ["pending", "archived", None, None, None]


async def test_archiving_a_group_trims_the_archive_with_the_hashes(
    redis: Redis, insp: Inspector, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cap of 9 keeps 8 (asynq's ZRANGE 0 -cap arithmetic).
    monkeypatch.setattr("asyncq._broker.triage.ARCHIVE_MAX_SIZE", 9)
    made = await seed_mixed(redis)
    too_old = GoTask("old")
    await go.seed_archived(redis, too_old, NOW - timedelta(days=91))
    elsewhere = GoTask("old", queue="critical")
    await go.seed_archived(redis, elsewhere, NOW - timedelta(days=91))
    result = await insp.archive_error_group(CONN.key)
    assert (result.acted, result.skipped) == (3, 0)
    # default's archive: 4 + 5 + 1 before, the 91-day-old one goes by age, and of the
    # 13 left after the 3 arrive the 5 oldest (the KeyError tasks) go over the cap.
    kept = {m.decode() for m in await redis.zrange("asynq:{default}:archived", 0, -1)}
    assert kept == {t.id for t in made["conn"][:7] + made["bad"]}
    for t in [too_old, *made["key"]]:
        assert not await redis.exists(t.key)
    assert await _states(redis, made["conn"][:7]) == ["archived"] * 7
    # Only the archive the tasks went to is trimmed.
    assert await redis.zcard("asynq:{critical}:archived") == 6
    assert await redis.exists(elsewhere.key)


async def test_archiving_a_group_trims_by_age_alone(redis: Redis, insp: Inspector) -> None:
    made = await seed_mixed(redis)
    too_old = GoTask("old")
    await go.seed_archived(redis, too_old, NOW - timedelta(days=91))
    result = await insp.archive_error_group(CONN.key)
    assert (result.acted, result.skipped) == (3, 0)
    assert not await redis.exists(too_old.key)
    assert await redis.zscore("asynq:{default}:archived", too_old.id) is None
    assert await redis.zcard("asynq:{default}:archived") == 13
    assert await _states(redis, made["key"]) == ["archived"] * 5


@pytest.mark.parametrize("action", ["run", "delete"])
async def test_running_or_deleting_a_group_never_trims_the_archive(
    redis: Redis, insp: Inspector, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    monkeypatch.setattr("asyncq._broker.triage.ARCHIVE_MAX_SIZE", 2)
    made = await seed_mixed(redis)
    too_old = GoTask("old")
    await go.seed_archived(redis, too_old, NOW - timedelta(days=91))
    act = insp.run_error_group if action == "run" else insp.delete_error_group
    result = await act(VALUE.key)
    assert (result.acted, result.skipped) == (2, 0)
    assert await redis.zcard("asynq:{default}:archived") == 11
    assert await _states(redis, [too_old, *made["key"]]) == ["archived"] * 6


async def test_archiving_trims_once_a_task_was_archived(
    redis: Redis, insp: Inspector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("asyncq._broker.triage.ARCHIVE_MAX_SIZE", 3)
    made = await seed_mixed(redis)
    too_old = GoTask("old")
    await go.seed_archived(redis, too_old, NOW - timedelta(days=91))
    stale = [(t.id, "0" * 40) for t in made["value"]]  # both failed again meanwhile
    broker = triage_mod.TriageBroker(redis, clock=NOW.timestamp)
    assert await broker.act("default", TaskState.RETRY, "archive", stale) == []
    assert await redis.zcard("asynq:{default}:archived") == 11
    assert await _states(redis, [too_old, *made["value"]]) == ["archived"] + ["retry"] * 2
    # One task archived is enough for the trim.
    one = made["value"][0]
    raw = await redis.hget(one.key, "msg")
    assert isinstance(raw, bytes)
    digest = hashlib.sha1(raw, usedforsecurity=False).hexdigest()
    assert await broker.act("default", TaskState.RETRY, "archive", [(one.id, digest)]) == [one.id]
    # The cap of 3 keeps the two newest: the undecodable one archived now, and this one.
    kept = {m.decode() for m in await redis.zrange("asynq:{default}:archived", 0, -1)}
    assert kept == {one.id, made["bad"][0].id}


async def test_deleting_a_group_leaves_locks_it_does_not_own(redis: Redis, insp: Inspector) -> None:
    made = await seed_mixed(redis)
    taken, broken = made["value"]
    await redis.set(taken.unique_key, "newer")  # a newer task holds the same lock now
    await redis.delete(broken.unique_key)
    await redis.hset(broken.unique_key, "x", "y")  # another program's key of that name
    result = await insp.delete_error_group(VALUE.key)
    assert (result.acted, result.skipped) == (2, 0)
    assert not await redis.exists(taken.key, broken.key)
    assert await redis.get(taken.unique_key) == b"newer"
    assert await redis.hgetall(broken.unique_key) == {b"x": b"y"}


@pytest.mark.parametrize(("action", "key"), [("run", "pending"), ("archive", "archived")])
async def test_a_wrong_typed_destination_writes_nothing(
    redis: Redis, insp: Inspector, monkeypatch: pytest.MonkeyPatch, action: str, key: str
) -> None:
    made = await seed_mixed(redis)
    real_act = triage_mod.TriageBroker.act
    before: dict[bytes, tuple[bytes, bytes | None]] = {}

    async def breaking_act(
        self: triage_mod.TriageBroker,
        qname: str,
        state: TaskState,
        action: str,
        tasks: Sequence[tuple[str, str]],
    ) -> list[str]:
        # Between the read and the action another program writes the destination.
        dest = f"asynq:{{{qname}}}:{key}"
        await redis.delete(dest)
        await redis.sadd(dest, "x")
        for k in sorted(await redis.keys("*")):
            before[k] = (await redis.type(k), await redis.dump(k))
        return await real_act(self, qname, state, action, tasks)

    monkeypatch.setattr(triage_mod.TriageBroker, "act", breaking_act)
    act = insp.run_error_group if action == "run" else insp.archive_error_group
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await act(VALUE.key)
    after = {k: (await redis.type(k), await redis.dump(k)) for k in sorted(await redis.keys("*"))}
    assert after == before
    assert await _states(redis, made["value"]) == ["retry"] * 2


def _digest(t: GoTask) -> str:
    return hashlib.sha1(t.encode(), usedforsecurity=False).hexdigest()


async def test_an_action_reads_its_pairs_as_id_then_digest(redis: Redis) -> None:
    # Ids are any strings, so one can be another task's digest: the script must take
    # the arguments two by two, never an id as a digest or a digest as an id. Here a
    # task of another error group is named by a's digest, and b's id is its digest.
    a = GoTask("t", error_msg="OSError: a")
    other = GoTask("t", id=_digest(a), error_msg="ValueError: another group")
    b = GoTask("t", id=_digest(other), error_msg="OSError: b")
    for t in (a, other, b):
        await go.seed_retry(redis, t, NOW)
    broker = triage_mod.TriageBroker(redis, clock=NOW.timestamp)
    done = await broker.act(
        "default", TaskState.RETRY, "delete", [(a.id, _digest(a)), (b.id, _digest(b))]
    )
    assert done == [a.id, b.id]
    assert await _states(redis, [a, other, b]) == [None, "retry", None]
    # Nor is a key named like a digest checked as a task key.
    c = GoTask("t", error_msg="OSError: c")
    await go.seed_retry(redis, c, NOW)
    await redis.set(f"asynq:{{default}}:t:{_digest(c)}", "another program's")
    assert await broker.act("default", TaskState.RETRY, "run", [(c.id, _digest(c))]) == [c.id]
    assert await _states(redis, [c]) == ["pending"]


async def test_a_later_wrong_typed_task_key_fails_the_call_before_any_write(
    redis: Redis,
) -> None:
    good, broken = GoTask("t", error_msg="OSError: a"), GoTask("t", error_msg="OSError: a")
    for t in (good, broken):
        await go.seed_retry(redis, t, NOW)
    digests = [(t.id, _digest(t)) for t in (good, broken)]
    await redis.delete(broken.key)
    await redis.set(broken.key, "not a hash")
    before = {k: await redis.dump(k) for k in sorted(await redis.keys("*"))}
    broker = triage_mod.TriageBroker(redis, clock=NOW.timestamp)
    with pytest.raises(BrokerError, match=f"WRONGTYPE {broken.key} is not a hash"):
        await broker.act("default", TaskState.RETRY, "run", digests)
    assert {k: await redis.dump(k) for k in sorted(await redis.keys("*"))} == before


async def test_group_action_arguments_are_checked(redis: Redis, insp: Inspector) -> None:
    await seed_mixed(redis)
    with pytest.raises(ValueError, match="12 hex digits"):
        await insp.run_error_group("ConnectionError")
    with pytest.raises(QueueNotFoundError):
        await insp.run_error_group(CONN.key, queues=["nope"])
    unknown = await insp.run_error_group(uuid.uuid4().hex[:12])
    assert (unknown.acted, unknown.skipped) == (0, 0)


# -- asyncq task errors ---------------------------------------------------------------------------


def _seeded_cli(redis_url: str, tmp_path: Path) -> tuple[Callable[..., Result], datetime]:
    # The CLI reads the wall clock: seed relative to it, not to the module's NOW (which a
    # long suite leaves minutes behind).
    now = datetime.now(UTC).replace(microsecond=0)

    async def seed() -> None:
        r = Redis.from_url(redis_url)
        try:
            await r.flushdb()
            await seed_mixed(r, now)
        finally:
            await r.aclose()

    asyncio.run(seed())
    runner = CliRunner(env={"COLUMNS": "200", "HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None})

    def invoke(*args: str) -> Result:
        return runner.invoke(main, ["-u", redis_url, "task", "errors", *args])

    return invoke, now


def test_cli_lists_groups(redis_url: str, tmp_path: Path) -> None:
    cli, _ = _seeded_cli(redis_url, tmp_path)
    result = cli()
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "5 error groups in 20 failed tasks"
    at = lines.index("9  ConnectionError: Error <n> connecting to <ip>. Connection refused.")
    assert lines[at + 1].startswith(f"   key {CONN.key}  archived 6, retry 3  first 31m")
    assert lines[at + 2] == "   types email 6, sms 3  queues default 7, critical 2"
    assert [line[0] for line in lines if line[:1].isdigit()] == ["5", "9", "5", "3", "2", "1"]
    capped = cli("--limit", "3")
    assert capped.output.splitlines()[0] == (
        "2 error groups in 3 of 20 failed tasks (the newest; raise --limit to read more)"
    )


def test_cli_json_and_filters(redis_url: str, tmp_path: Path) -> None:
    cli, now = _seeded_cli(redis_url, tmp_path)
    data = json.loads(cli("--json", "-q", "critical", "-s", "archived").output)
    assert (data["scanned"], data["total"], data["capped"]) == (5, 5, False)
    assert {g["key"]: g["count"] for g in data["groups"]} == {CONN.key: 2, DIAL.key: 3}
    dial = next(g for g in data["groups"] if g["key"] == DIAL.key)
    assert dial["task_types"] == {"report": 3}
    assert dial["last_seen"] == (now - timedelta(minutes=50)).isoformat()


def test_cli_acts_on_a_group(redis_url: str, tmp_path: Path) -> None:
    cli, _ = _seeded_cli(redis_url, tmp_path)
    assert cli("--delete", CONN.key, "-q", "critical").output == "2 tasks deleted\n"
    assert cli("--archive", CONN.key).output == "3 tasks archived\n"
    assert cli("--run", CONN.key.upper()).output == "7 tasks moved to pending\n"
    assert json.loads(cli("--run", CONN.key, "--json").output) == {"acted": 0, "skipped": 0}
    data = json.loads(cli("--json").output)
    assert sum(g["count"] for g in data["groups"]) == 11


def test_cli_errors_are_one_line(redis_url: str, tmp_path: Path) -> None:
    cli, _ = _seeded_cli(redis_url, tmp_path)
    both = cli("--run", CONN.key, "--delete", CONN.key)
    assert both.exit_code == 2 and "at most one of --run, --archive, --delete" in both.output
    for args, needle in [
        (("-q", "nope"), "nope"),
        (("--run", "xyz"), "12 hex digits"),
    ]:
        result = cli(*args)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("error: ") and needle in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


async def test_deleting_a_group_resolves_its_workflow_steps(redis: Redis) -> None:
    async with Client(redis) as client:
        info = await chord(
            [Task("wf:member"), Task("wf:member")], Task("wf:cb", retention=timedelta(minutes=1))
        ).enqueue(client)
    step = info.stages[0][1].id
    # The step failed once and waits for a retry (as the worker's retry leaves it).
    raw = await redis.hget(keys.task_key("default", step), "msg")
    assert isinstance(raw, bytes)
    msg = decode_task_message(raw)
    msg.error_msg, msg.last_failed_at, msg.retried = "OSError: disk 3 full", go.unix(NOW), 1
    await redis.lrem(keys.pending_key("default"), 0, step)
    await redis.hset(
        keys.task_key("default", step),
        mapping={"msg": encode_task_message(msg), "state": "retry"},
    )
    await redis.zadd(keys.retry_key("default"), {step: go.unix(NOW) + 60})
    async with Inspector(redis) as insp:
        result = await insp.delete_error_group(error_signature("OSError: disk 9 full").key)
        assert (result.acted, result.skipped) == (1, 0)
        seen = await insp.get_workflow("default", info.id)
    assert {s.id: s.state for s in seen.stages[0]}[step] == "failed"
    assert seen.state == "failed"


async def test_broken_task_keys_are_skipped_and_never_half_written(
    redis: Redis, insp: Inspector, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = await seed_mixed(redis)
    keyerr = made["key"]
    await redis.delete(keyerr[4].key)
    await redis.set(keyerr[4].key, "not a hash")  # another program broke one task key
    assert _by_key(await insp.error_groups())[KEYERR.key].count == 4
    real_act = triage_mod.TriageBroker.act

    async def breaking_act(
        self: triage_mod.TriageBroker,
        qname: str,
        state: TaskState,
        action: str,
        tasks: Sequence[tuple[str, str]],
    ) -> list[str]:
        await redis.delete(keyerr[3].key)  # and one more between the read and the action
        await redis.set(keyerr[3].key, "not a hash")
        return await real_act(self, qname, state, action, tasks)

    monkeypatch.setattr(triage_mod.TriageBroker, "act", breaking_act)
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        await insp.delete_error_group(KEYERR.key)
    assert await _states(redis, keyerr[:3]) == ["archived"] * 3  # nothing deleted
    assert await redis.zcard("asynq:{default}:archived") == 10
