"""asyncq against Redis data written by the real Go asynq v0.26.0 (tests/support/golden.py).

The snapshot is restored key by key (type, value, TTL) into a throwaway Redis.
Expected values come from the fixture's scenario (what the Go program did), written
out here by hand and encoded with the independent encoder of tests/support/gofixtures.py:
nothing below is derived from asyncq's own encoding.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from redis.asyncio import Redis

from asyncq import Client, Inspector, ServeMux, Server, Task, TaskState
from asyncq.cli import main
from tests.support import golden
from tests.support.gofixtures import GoTask
from tests.support.helpers import expiretime
from tests.support.procs import FAST, wait_until
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.xdist_group("golden")

DEADLINE = 4102444799  # 2099-12-31T23:59:59Z
PROCESS_AT = 4102444800  # 2100-01-01T00:00:00Z
HIGH = "critical:high-prio"
EVERY_ENTRY = "golden:cron-every"
LEASE_EXPIRED = "asynq: task lease expired"


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def expected_messages() -> dict[str, GoTask]:
    """Every task of DB 0 whose message bytes do not depend on the time of the run."""
    t = [
        GoTask("golden:plain", b'{"hello":"world"}', id="p-plain"),
        GoTask(
            "golden:headers",
            b"with-headers",
            id="p-headers",
            headers={"trace-id": "abc123", "tenant": "acme"},
        ),
        GoTask("golden:empty", b"", id="p-empty"),
        GoTask("golden:nil", b"", id="p-nil"),
        GoTask("golden:binary", bytes(range(256)), id="p-binary"),
        GoTask("golden:1kb", b"0123456789abcdef" * 64, id="p-1kb"),
        GoTask(
            "golden:unique",
            b"unique-payload",
            id="p-unique",
            unique_key=f"asynq:{{default}}:unique:golden:unique:{md5(b'unique-payload')}",
        ),
        GoTask(
            "golden:unique-nil",
            id="p-unique-nil",
            unique_key="asynq:{default}:unique:golden:unique-nil:",
        ),
        GoTask(
            "golden:opts", b"opts", id="p-opts", queue=HIGH, retry=3, timeout=90, deadline=DEADLINE
        ),
        GoTask("golden:retention", b"keep", id="p-retention", queue=HIGH, retention=7200),
        GoTask("golden:low", b"low-1", id="p-low-1", queue="low"),
        GoTask("golden:low", b"low-2", id="p-low-2", queue="low", retry=0),
        GoTask("golden:scheduled", b"far-future", id="s-far"),
        GoTask(
            "golden:scheduled-unique",
            b"far-unique",
            id="s-unique",
            queue=HIGH,
            unique_key=f"asynq:{{{HIGH}}}:unique:golden:scheduled-unique:{md5(b'far-unique')}",
        ),
        GoTask(
            "golden:scheduled", b"maxretry0", id="s-maxretry0", queue="low", retry=0, timeout=60
        ),
        GoTask("golden:agg", b"agg-1", id="a-1", group_key="g1"),
        GoTask("golden:agg", b"agg-2", id="a-2", group_key="g1"),
        GoTask(
            "golden:agg",
            b"agg-3",
            id="a-3",
            queue=HIGH,
            group_key="g2",
            unique_key=f"asynq:{{{HIGH}}}:unique:golden:agg:{md5(b'agg-3')}",
        ),
        GoTask("golden:block", b"block-me", id="w-active", queue="work", timeout=600),
        *(GoTask("golden:agg-work", f"wa-{i}".encode(), id=f"wa-{i}", queue="work", group_key="gx")
          for i in (1, 2, 3)),
    ]  # fmt: skip
    return {task.id: task for task in t}


def stored(dump: dict[str, golden.GoldenKey], queue: str, task_id: str) -> GoTask:
    return GoTask.decode(dump[f"asynq:{{{queue}}}:t:{task_id}"].raw[b"msg"])


def snapshot_time() -> datetime:
    return datetime.fromtimestamp(golden.snapshot_unix(), UTC)


def cron_task_id() -> str:
    (key,) = [k for k in golden.snapshot_keys() if k.startswith("asynq:{cron}:t:")]
    return key.rsplit(":", 1)[1]


@pytest.fixture
async def loaded(redis: Redis) -> Redis:
    """The test's Redis holding exactly the Go snapshot."""
    await golden.restore(redis, golden.snapshot_keys())
    return redis


# -- the fixture itself ---------------------------------------------------------------------


def test_fixtures_are_inside_the_repository_and_unedited() -> None:
    # A user's clone has nothing beside it: the fixtures must live in tests/, and each file
    # must still be what Go asynq v0.26.0 wrote (sizes and digests recorded when copied).
    path = golden.fixture_dir()
    assert path.is_relative_to(Path(__file__).resolve().parents[1])
    for name, digest in golden.DIGESTS.items():
        assert hashlib.sha256((path / name).read_bytes()).hexdigest() == digest, name


async def test_snapshot_restores_every_key_with_type_value_and_ttl(loaded: Redis) -> None:
    dump = golden.snapshot_keys()
    assert len(dump) == golden.state()["snapshot"]["key_count"] == 63
    assert sorted(k.decode() for k in await loaded.keys("*")) == sorted(dump)
    for name, key in dump.items():
        kind, value = await golden.read_back(loaded, name)
        assert kind == key.type, name
        expected = sorted(key.raw) if key.type == "set" else key.raw
        assert value == expected, name
        ttl = await loaded.pttl(name)
        if key.ttl_ms < 0:
            assert ttl == -1, name
        else:
            assert 0 < ttl <= key.ttl_ms, name


def test_independent_encoder_writes_go_bytes() -> None:
    # Every time-independent message is byte-exact with the independent encoder, except
    # the two-entry header map (Go's map order is random): that one is compared decoded.
    dump = golden.snapshot_keys()
    for task_id, want in expected_messages().items():
        raw = dump[want.key].raw[b"msg"]
        assert GoTask.decode(raw) == want, task_id
        if len(want.headers) < 2:
            assert want.encode() == raw, task_id


def test_run_dependent_messages_carry_what_the_scenario_says() -> None:
    dump = golden.snapshot_keys()
    msgs = golden.state()["manifest"]["messages"]
    retry = stored(dump, "work", "w-retry")
    failed_at = retry.last_failed_at
    assert retry == GoTask(
        "golden:fail-once",
        b"retry-me",
        id="w-retry",
        queue="work",
        retry=5,
        retried=1,
        error_msg=msgs["retry_error_msg"],
        last_failed_at=failed_at,
    )
    archived = stored(dump, "work", "w-archive")
    assert archived == GoTask(
        "golden:skip-retry",
        b"archive-me",
        id="w-archive",
        queue="work",
        error_msg=msgs["archived_error_msg"],
        last_failed_at=archived.last_failed_at,
    )
    complete = stored(dump, "work", "w-complete")
    assert complete == GoTask(
        "golden:complete",
        b"complete-me",
        id="w-complete",
        queue="work",
        timeout=0,
        deadline=DEADLINE,
        retention=86400,
        completed_at=complete.completed_at,
    )
    # Scores follow the messages: retry at failure + 24 h, completed at completed_at + 24 h.
    assert dump["asynq:{work}:retry"].raw == [(b"w-retry", float(failed_at + 86400))]
    assert dump["asynq:{work}:archived"].raw == [(b"w-archive", float(archived.last_failed_at))]
    assert dump["asynq:{work}:completed"].raw == [
        (b"w-complete", float(complete.completed_at + 86400))
    ]
    cron = stored(dump, "cron", cron_task_id())
    assert cron == GoTask(EVERY_ENTRY, b"cron-payload", id=cron_task_id(), queue="cron", retry=2)


# -- Inspector --------------------------------------------------------------------------------


async def test_inspector_reports_the_go_state(loaded: Redis) -> None:
    now = snapshot_time()
    async with Inspector(loaded, clock=golden.snapshot_unix) as insp:
        assert await insp.queues() == ["critical:high-prio", "cron", "default", "low", "work"]
        counts = {}
        for q in await insp.queues():
            info = await insp.queue_info(q)
            assert info.timestamp == now
            counts[q] = (
                info.size, info.groups, info.pending, info.active, info.scheduled, info.retry,
                info.archived, info.completed, info.aggregating, info.processed, info.failed,
                info.processed_total, info.failed_total, info.paused,
            )  # fmt: skip
            assert info.memory_usage > 0
        assert counts == {
            HIGH: (4, 1, 2, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, False),
            "cron": (1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, False),
            "default": (11, 1, 8, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, False),
            "low": (3, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, True),
            # wa-1 and wa-2 sit in an aggregation set: Go counts only the group zsets.
            "work": (5, 1, 0, 1, 0, 1, 1, 1, 1, 4, 2, 4, 2, False),
        }
        # Latency: the oldest pending task's pending_since (ns) against the snapshot time.
        dump = golden.snapshot_keys()
        oldest = int(dump["asynq:{default}:t:p-plain"].raw[b"pending_since"])
        latency = (await insp.queue_info("default")).latency
        assert abs(latency.total_seconds() - (now.timestamp() - oldest / 1e9)) < 1e-3
        assert (await insp.queue_info("work")).latency == timedelta(0)

        (work_day,) = await insp.history("work", days=1)
        assert (work_day.date, work_day.processed, work_day.failed) == (now.date(), 4, 2)
        assert [(g.group, g.size) for g in await insp.groups("default")] == [("g1", 2)]
        assert [(g.group, g.size) for g in await insp.groups(HIGH)] == [("g2", 1)]
        assert [(g.group, g.size) for g in await insp.groups("work")] == [("gx", 1)]

        want = expected_messages()
        pending = {q: [t.id for t in await insp.list_pending(q)] for q in await insp.queues()}
        # Listed in dequeue order: the oldest (the tail of the list) first.
        assert pending == {
            HIGH: ["p-opts", "p-retention"],
            "cron": [cron_task_id()],
            "default": ["p-plain", "p-headers", "p-empty", "p-nil", "p-binary", "p-1kb",
                        "p-unique", "p-unique-nil"],
            "low": ["p-low-1", "p-low-2"],
            "work": [],
        }  # fmt: skip
        for task_id in ("p-opts", "p-headers", "p-binary", "p-empty", "p-low-2"):
            go = want[task_id]
            info = await insp.get_task(go.queue, task_id)
            assert info.state is TaskState.PENDING
            assert (info.type, info.payload, info.headers) == (go.type, go.payload, go.headers)
            assert info.max_retry == go.retry and info.retried == 0
            assert info.timeout == (timedelta(seconds=go.timeout) if go.timeout else None)
            want_deadline = datetime.fromtimestamp(go.deadline, UTC) if go.deadline else None
            assert info.deadline == want_deadline

        scheduled = {q: [t.id for t in await insp.list_scheduled(q)] for q in await insp.queues()}
        assert scheduled == {
            HIGH: ["s-unique"], "cron": [], "default": ["s-far"], "low": ["s-maxretry0"],
            "work": [],
        }  # fmt: skip
        far = datetime.fromtimestamp(PROCESS_AT, UTC)
        for task_id, queue in (("s-unique", HIGH), ("s-far", "default"), ("s-maxretry0", "low")):
            info = await insp.get_task(queue, task_id)
            assert (info.state, info.next_process_at) == (TaskState.SCHEDULED, far)
        s0 = await insp.get_task("low", "s-maxretry0")
        assert (s0.max_retry, s0.timeout) == (0, timedelta(minutes=1))

        (active,) = await insp.list_active("work")
        assert (active.id, active.state, active.timeout) == (
            "w-active", TaskState.ACTIVE, timedelta(minutes=10),
        )  # fmt: skip
        assert not active.is_orphaned  # its lease is still ahead of the snapshot

        (retry,) = await insp.list_retry("work")
        msgs = golden.state()["manifest"]["messages"]
        assert (retry.id, retry.retried, retry.max_retry, retry.last_error) == (
            "w-retry", 1, 5, msgs["retry_error_msg"],
        )  # fmt: skip
        assert retry.last_failed_at is not None
        assert retry.next_process_at == retry.last_failed_at + timedelta(hours=24)

        (archived,) = await insp.list_archived("work")
        assert (archived.id, archived.last_error) == ("w-archive", msgs["archived_error_msg"])

        (done,) = await insp.list_completed("work")
        assert (done.id, done.result, done.retention) == (
            "w-complete", msgs["result"].encode(), timedelta(days=1),
        )  # fmt: skip
        assert done.timeout is None and done.deadline == datetime.fromtimestamp(DEADLINE, UTC)
        assert done.completed_at is not None

        g1 = await insp.list_aggregating("default", "g1")
        assert [(t.id, t.group, t.payload) for t in g1] == [
            ("a-1", "g1", b"agg-1"), ("a-2", "g1", b"agg-2"),
        ]  # fmt: skip
        assert [t.id for t in await insp.list_aggregating("work", "gx")] == ["wa-3"]
        staged = await insp.get_task("work", "wa-1")
        assert (staged.state, staged.group) == (TaskState.AGGREGATING, "gx")

        (server,) = await insp.servers()
        manifest = golden.state()["manifest"]
        assert (server.pid, server.concurrency, server.queues) == (manifest["pid"], 4, {"work": 3})
        assert (server.strict_priority, server.status) == (False, "active")
        (worker,) = server.active_workers
        assert (worker.task_id, worker.task_type, worker.task_payload, worker.queue) == (
            "w-active", "golden:block", b"block-me", "work",
        )  # fmt: skip
        # The deadline is start + Timeout(10m), computed separately (nanos differ slightly).
        assert abs((worker.deadline - worker.started) - timedelta(minutes=10)) < timedelta(
            milliseconds=5
        )

        entries = await insp.scheduler_entries()
        got = [(e.spec, e.task_type, e.task_payload, e.options) for e in entries]
        assert got == [
            ("@every 25s", EVERY_ENTRY, b"cron-payload", ['Queue("cron")', "MaxRetry(2)"]),
            ("0 0 1 1 *", "golden:cron-yearly", b"", ['Queue("cron")', "Timeout(1m0s)"]),
        ]
        every, yearly = entries
        assert yearly.next == datetime(2027, 1, 1, tzinfo=UTC) and yearly.prev is None
        assert every.prev is not None and every.next - every.prev == timedelta(seconds=25)
        (event,) = await insp.scheduler_enqueue_events(every.id)
        assert event.task_id == cron_task_id()
        assert abs(event.enqueued_at - every.prev) < timedelta(seconds=1)
        assert await insp.scheduler_enqueue_events(yearly.id) == []


# -- CLI --------------------------------------------------------------------------------------


@pytest.fixture
def golden_server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    try:
        yield srv
    finally:
        srv.cleanup()


async def _restore_into(url: str) -> None:
    r = Redis.from_url(url)
    try:
        await golden.restore(r, golden.snapshot_keys())
    finally:
        await r.aclose()


def test_cli_reports_the_go_state(golden_server: RedisServer, tmp_path: Path) -> None:
    asyncio.run(_restore_into(golden_server.url))
    runner = CliRunner(env={"COLUMNS": "120", "HOME": str(tmp_path), "ASYNCQ_REDIS_URL": None})

    def cli(*args: str) -> Result:
        res = runner.invoke(main, ["-u", golden_server.url, *args], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return res

    def cli_json(*args: str) -> Any:
        return json.loads(cli(*args, "--json").stdout)

    assert cli("queue", "ls").stdout.split() == [HIGH, "cron", "default", "low", "work"]

    today = datetime.now(UTC).date()
    same_day = today == snapshot_time().date()
    (work,) = cli_json("queue", "inspect", "work")
    counts = {k: work[k] for k in ("size", "groups", "pending", "active", "scheduled", "retry")}
    counts |= {k: work[k] for k in ("archived", "completed", "aggregating", "paused")}
    assert counts == {
        "size": 5, "groups": 1, "pending": 0, "active": 1, "scheduled": 0, "retry": 1,
        "archived": 1, "completed": 1, "aggregating": 1, "paused": False,
    }  # fmt: skip
    assert (work["processed_total"], work["failed_total"]) == (4, 2)
    # The daily counters are keyed by the UTC date of the Go run.
    assert (work["processed"], work["failed"]) == ((4, 2) if same_day else (0, 0))
    (low,) = cli_json("queue", "inspect", "low")
    assert (low["paused"], low["pending"], low["scheduled"]) == (True, 2, 1)

    history = cli_json("queue", "history", "work", "--days", "400")["work"]
    by_day = {date.fromisoformat(d["date"]): (d["processed"], d["failed"]) for d in history}
    if (today - snapshot_time().date()).days < 400:
        assert by_day[snapshot_time().date()] == (4, 2)

    (retry,) = cli_json("task", "ls", "-q", "work", "-s", "retry")
    assert (retry["id"], retry["retried"], retry["max_retry"], retry["payload"]) == (
        "w-retry", 1, 5, "retry-me",
    )  # fmt: skip
    assert retry["last_error"] == "golden: planned failure on attempt 1"
    done = cli_json("task", "inspect", "-q", "work", "-i", "w-complete")
    assert (done["state"], done["result"], done["retention"], done["timeout"]) == (
        "completed", "golden-result:w-complete", 86400.0, None,
    )  # fmt: skip
    assert done["deadline"] == "2099-12-31T23:59:59+00:00"
    binary = cli_json("task", "inspect", "-q", "default", "-i", "p-binary")
    assert binary["payload_base64"] is not None
    assert base64.b64decode(binary["payload_base64"]) == bytes(range(256))
    headers = cli_json("task", "inspect", "-q", "default", "-i", "p-headers")
    assert headers["headers"] == {"tenant": "acme", "trace-id": "abc123"}

    pending = [t["id"] for t in cli_json("task", "ls", "-q", "default", "-s", "pending")]
    assert pending == ["p-plain", "p-headers", "p-empty", "p-nil", "p-binary", "p-1kb",
                       "p-unique", "p-unique-nil"]  # fmt: skip
    agg = cli_json("task", "ls", "-q", "default", "-s", "aggregating", "-g", "g1")
    assert [(t["id"], t["group"]) for t in agg] == [("a-1", "g1"), ("a-2", "g1")]
    assert cli_json("group", "ls", "-q", "work") == [{"group": "gx", "size": 1}]

    every_id = golden.state()["manifest"]["scheduler"]["entries"][0]["id"]
    events = cli_json("cron", "history", every_id)[every_id]
    assert [e["task_id"] for e in events] == [cron_task_id()]
    # Go's ListServers and ListSchedulerEntries only return entries whose index score
    # (their expiry) is still ahead of now; the snapshot's are past, as Go would see them.
    assert "No running servers" in cli("server", "ls").stdout


# -- a worker on the Go state -------------------------------------------------------------


@pytest.fixture
async def worker_redis(redis: Redis) -> AsyncIterator[Redis]:
    await golden.restore(redis, golden.snapshot_keys())
    yield redis


async def test_asyncq_server_processes_go_tasks_to_the_state_go_leaves(loaded: Redis) -> None:
    """Pending and retry tasks are processed; what stays is what Go's worker would leave.

    A Go worker on these queues with the same handlers would: run every pending task of
    the unpaused queues (done: hash deleted, unique lock released; p-retention completed),
    skip the paused queue, forward w-retry once due and succeed on attempt 2, retry the
    active task whose lease (held by the stopped Go process) expired, and move the stale
    aggregation set's tasks back into their group.
    """
    dump = golden.snapshot_keys()
    want = expected_messages()
    handled: dict[str, tuple[str, bytes, dict[str, str], int, int]] = {}
    # w-complete's 24 h retention runs from the snapshot: once it is over, the janitor
    # deletes it (as Go's would); before, it stays as Go left it.
    completed_scores = [float(score) for _, score in dump["asynq:{work}:completed"].raw]
    w_complete_expired = max(completed_scores) <= datetime.now(UTC).timestamp()

    async def record(task: Task) -> None:
        assert task.id is not None
        handled[task.id] = (task.type, task.payload, task.headers, task.retry_count, task.max_retry)
        if task.type == "golden:fail-once" and task.retry_count == 0:
            raise RuntimeError("never: attempt 1 already failed in Go")

    mux = ServeMux()
    for task_type in {m.type for m in want.values()} | {"golden:fail-once", EVERY_ENTRY}:
        mux.handle(task_type, record)
    # 24 h passed: w-retry is due (the forwarder picks it up, as Go's would).
    await loaded.zadd("asynq:{work}:retry", {"w-retry": 1}, xx=True)
    queues = {"default": 1, HIGH: 1, "low": 1, "cron": 1, "work": 1}
    server = Server(
        loaded,
        concurrency=4,
        queues=queues,
        retry_delay=lambda n, err, task: timedelta(hours=24),
        **FAST,
    )
    await server.start(mux)
    try:
        done_ids = {*want} - {"p-low-1", "p-low-2", "s-far", "s-unique", "s-maxretry0"}
        done_ids -= {"a-1", "a-2", "a-3", "w-active", "wa-1", "wa-2", "wa-3"}
        done_ids |= {cron_task_id(), "w-retry"}

        async def settled() -> bool:
            return (
                set(handled) >= done_ids
                and await loaded.zscore("asynq:{work}:retry", "w-active") is not None
                and not await loaded.exists("asynq:{work}:aggregation_sets")
                and not await loaded.exists("asynq:{default}:pending", "asynq:{cron}:pending")
                and not (w_complete_expired and await loaded.exists("asynq:{work}:completed"))
            )

        await wait_until(settled, within=30, what="the Go tasks processed and recovered")
    finally:
        await server.shutdown()
    assert set(handled) == done_ids
    for task_id in done_ids - {cron_task_id(), "w-retry"}:
        go = want[task_id]
        assert handled[task_id] == (go.type, go.payload, go.headers, 0, go.retry), task_id
    assert handled["w-retry"] == ("golden:fail-once", b"retry-me", {}, 1, 5)
    assert handled[cron_task_id()] == (EVERY_ENTRY, b"cron-payload", {}, 0, 2)

    now = datetime.now(UTC).timestamp()
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    go_day = snapshot_time().strftime("%Y-%m-%d")
    same_day = today == go_day

    # Every key that remains, by name; the Go server/worker/scheduler heartbeat keys expire
    # by their own TTL and are left out (asyncq's own ones must be gone after shutdown).
    volatile = ("asynq:servers", "asynq:workers", "asynq:schedulers")
    every = [k.decode() for k in await loaded.keys("*")]
    # asyncq's metrics history (on by default): one hash per queue that ran tasks and
    # minute, under a name Go never reads, expiring 24 h after its minute
    history = [k for k in every if ":asyncq:metrics:" in k]
    assert {k.split(":asyncq:metrics:")[0] for k in history} == {
        f"asynq:{{{q}}}" for q in ("default", HIGH, "cron", "work")
    }
    for key in history:
        assert await loaded.type(key) == b"hash"
        minute = int(key.rsplit(":", 1)[1])
        # the helper, not EXPIRETIME (Redis 7.0+): the matrix runs this on Redis 6.2 too
        assert await expiretime(loaded, key) == (minute + 1) * 60 + 24 * 3600
    remaining = sorted(k for k in every if not k.startswith(volatile) and k not in history)
    counters = {f"asynq:{{{q}}}:processed" for q in ("default", HIGH, "cron", "work")} | {
        f"asynq:{{{q}}}:processed:{today}" for q in ("default", HIGH, "cron", "work")
    }
    counters |= {"asynq:{work}:failed", f"asynq:{{work}}:failed:{today}"}
    counters |= {f"asynq:{{work}}:processed:{go_day}", f"asynq:{{work}}:failed:{go_day}"}
    unchanged = {
        k for k in dump
        if k.startswith(("asynq:{low}:", "asynq:scheduler_history:"))
        or k in ("asynq:queues", "asynq:{default}:scheduled", "asynq:{default}:t:s-far",
                 "asynq:{default}:g:g1", "asynq:{default}:groups", "asynq:{default}:t:a-1",
                 "asynq:{default}:t:a-2", f"asynq:{{{HIGH}}}:scheduled",
                 f"asynq:{{{HIGH}}}:t:s-unique", f"asynq:{{{HIGH}}}:g:g2",
                 f"asynq:{{{HIGH}}}:groups", f"asynq:{{{HIGH}}}:t:a-3",
                 "asynq:{work}:archived", "asynq:{work}:t:w-archive", "asynq:{work}:completed",
                 "asynq:{work}:t:w-complete", "asynq:{work}:groups")
        or k.startswith((f"asynq:{{{HIGH}}}:unique:golden:scheduled-unique:",
                         f"asynq:{{{HIGH}}}:unique:golden:agg:"))
    }  # fmt: skip
    changed = {
        f"asynq:{{{HIGH}}}:completed", f"asynq:{{{HIGH}}}:t:p-retention",
        "asynq:{work}:retry", "asynq:{work}:t:w-active", "asynq:{work}:g:gx",
        "asynq:{work}:t:wa-1", "asynq:{work}:t:wa-2", "asynq:{work}:t:wa-3",
    }  # fmt: skip
    if w_complete_expired:
        unchanged -= {"asynq:{work}:completed", "asynq:{work}:t:w-complete"}
    assert remaining == sorted(unchanged | changed | counters)

    for name in unchanged:
        kind, value = await golden.read_back(loaded, name)
        key = dump[name]
        assert (kind, value) == (key.type, sorted(key.raw) if kind == "set" else key.raw), name

    async def count(key: str) -> int:
        return int(await loaded.get(key) or 0)

    for q, n in (("default", 8), (HIGH, 2), ("cron", 1)):
        assert await count(f"asynq:{{{q}}}:processed") == n, q
        assert await count(f"asynq:{{{q}}}:processed:{today}") == n, q
        assert await loaded.ttl(f"asynq:{{{q}}}:processed:{today}") > 89 * 86400
    # work: 4 processed / 2 failed by Go, then w-retry done and w-active's lease failure.
    assert (await count("asynq:{work}:processed"), await count("asynq:{work}:failed")) == (6, 3)
    day_before = (4, 2) if same_day else (0, 0)
    assert await count(f"asynq:{{work}}:processed:{today}") == day_before[0] + 2
    assert await count(f"asynq:{{work}}:failed:{today}") == day_before[1] + 1

    # p-retention: completed, completed_at set, scored completed_at + 2 h, no pending_since.
    h = await loaded.hgetall(f"asynq:{{{HIGH}}}:t:p-retention")
    assert set(h) == {b"msg", b"state"} and h[b"state"] == b"completed"
    msg = GoTask.decode(h[b"msg"])
    assert abs(msg.completed_at - now) < 60
    expect = want["p-retention"]
    expect.completed_at = msg.completed_at
    assert h[b"msg"] == expect.encode()
    assert await loaded.zrange(f"asynq:{{{HIGH}}}:completed", 0, -1, withscores=True) == [
        (b"p-retention", float(msg.completed_at + 7200))
    ]

    # w-active: the lease expired with the Go process, so it is retried as a failure.
    h = await loaded.hgetall("asynq:{work}:t:w-active")
    assert set(h) == {b"msg", b"state"} and h[b"state"] == b"retry"
    msg = GoTask.decode(h[b"msg"])
    expect = want["w-active"]
    expect.retried, expect.error_msg, expect.last_failed_at = 1, LEASE_EXPIRED, msg.last_failed_at
    assert h[b"msg"] == expect.encode()
    assert abs(msg.last_failed_at - now) < 60
    ((member, score),) = await loaded.zrange("asynq:{work}:retry", 0, -1, withscores=True)
    assert member == b"w-active" and abs(score - (msg.last_failed_at + 86400)) <= 1

    # The stale aggregation set is reclaimed into g:gx with its enqueue-time scores.
    (set_key,) = [k for k in dump if k.startswith("asynq:{work}:g:gx:")]
    staged = dict(dump[set_key].raw)
    group = dict(dump["asynq:{work}:g:gx"].raw)
    assert dict(await loaded.zrange("asynq:{work}:g:gx", 0, -1, withscores=True)) == {
        **group, **staged,
    }  # fmt: skip
    for i in (1, 2, 3):
        name = f"asynq:{{work}}:t:wa-{i}"
        assert await loaded.hgetall(name) == dump[name].raw

    # The unique locks of the tasks that succeeded are released; the others keep theirs.
    assert not await loaded.exists(*(want[i].unique_key for i in ("p-unique", "p-unique-nil")))

    # asyncq's own heartbeat records are gone after the shutdown: only Go's are listed.
    for index in volatile:
        assert await loaded.zrange(index, 0, -1) == [m for m, _ in dump[index].raw], index


# -- asyncq's encoding of the same enqueues ----------------------------------------------------


ENQUEUE_OPTIONS: dict[str, dict[str, Any]] = {
    "eb-plain": {},
    "eb-queue": {"queue": HIGH},
    "eb-max_retry": {"max_retry": 3},
    "eb-timeout": {"timeout": timedelta(seconds=90)},
    "eb-deadline": {"deadline": datetime.fromtimestamp(DEADLINE, UTC)},
    "eb-unique": {"unique": timedelta(hours=1)},
    "eb-retention": {"retention": timedelta(hours=24)},
    "eb-group": {"group": "g1"},
    "eb-process_at": {"process_at": datetime.fromtimestamp(PROCESS_AT, UTC)},
    "eb-headers": {"headers": {"trace-id": "abc123", "tenant": "acme"}},
    "eb-headers1": {"headers": {"trace-id": "abc123"}},
}


async def test_asyncq_enqueues_write_the_bytes_go_wrote(redis: Redis) -> None:
    fixture = golden.enqueue_bytes()
    rows = {row["id"]: row for row in fixture["enqueues"]}
    assert set(rows) == set(ENQUEUE_OPTIONS)
    async with Client(redis) as client:
        for n, (task_id, options) in enumerate(ENQUEUE_OPTIONS.items(), start=1):
            payload = f'{{"to":"user{n}@example.com"}}'.encode()
            assert rows[task_id]["payload"].encode() == payload
            await client.enqueue(Task("email:send", payload), task_id=task_id, **options)

    go_dump = golden.load_keys(fixture["db_dump"])
    assert len(go_dump) == fixture["snapshot"]["key_count"] == 18
    assert sorted(k.decode() for k in await redis.keys("*")) == sorted(go_dump)
    for name, key in go_dump.items():
        kind, value = await golden.read_back(redis, name)
        assert kind == key.type, name
        if key.type == "hash":
            raw = key.raw
            go_msg, ours = raw.pop(b"msg"), value.pop(b"msg")
            # Field by field: the same fields, same values (pending_since is a time).
            assert GoTask.decode(ours) == GoTask.decode(go_msg), name
            assert set(value) == set(raw), name
            for f in raw:
                if f != b"pending_since":
                    assert value[f] == raw[f], (name, f)
            if b"pending_since" in raw:
                assert abs(int(value[b"pending_since"]) / 1e9 - datetime.now(UTC).timestamp()) < 60
            # Byte-exact where Go's output is deterministic (not a map of two entries).
            if len(GoTask.decode(go_msg).headers) < 2:
                assert ours == go_msg, name
            assert go_msg == bytes.fromhex(rows[name.rsplit(":", 1)[1]]["msg_hex"]), name
        elif key.type == "zset":
            # Members exact; scores are times: ProcessAt is fixed, g:<group> is enqueue time.
            assert [m for m, _ in value] == [m for m, _ in key.raw], name
            if name.endswith(":scheduled"):
                assert value == key.raw
        elif key.type == "string":
            # The unique lock: its value is the task id, its TTL the Unique duration.
            assert value == key.raw, name
            assert 3500_000 < await redis.pttl(name) <= 3600_000
        else:
            assert value == (sorted(key.raw) if key.type == "set" else key.raw), name
