"""The chaos suite's own parts: duplicate explanation, the partition proxy, one real scenario."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncq import Connection
from chaos.harness import PREFIX, Harness
from chaos.ledger import Fault, LedgerView, Run, duplicates
from chaos.proxy import PartitionProxy
from chaos.runner import markdown
from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]


def test_a_kill_explains_only_runs_in_flight_on_that_worker() -> None:
    kill = Fault("kill", 100.0, 100.0, pid=7)
    assert kill.explains(Run("a", 7, start=99.0))  # running when killed
    assert kill.explains(Run("b", 7, start=90.0, done=99.5))  # its ack may have been lost
    assert not kill.explains(Run("c", 7, start=90.0, done=95.0))  # acknowledged long before
    assert not kill.explains(Run("d", 8, start=99.0))  # another worker
    assert not kill.explains(Run("e", 7, start=101.0))  # started after the kill


def test_a_redis_fault_explains_runs_of_every_worker_around_it() -> None:
    crash = Fault("redis SIGKILL", 100.0, 102.0)
    assert crash.explains(Run("a", 1, start=101.0, done=101.5))
    assert crash.explains(Run("b", 2, start=97.0, done=98.5))  # ack within the window
    assert not crash.explains(Run("c", 3, start=90.0, done=91.0))


def test_duplicates_count_every_extra_run_and_its_explanation() -> None:
    view = LedgerView()
    view.runs["t1"] = [Run("1", 7, 99.0), Run("2", 8, 105.0, 105.1)]  # explained by the kill
    view.runs["t2"] = [Run("3", 8, 10.0, 10.1), Run("4", 9, 20.0, 20.1)]  # unexplained
    view.runs["t3"] = [Run("5", 9, 1.0, 1.1)]  # ran once
    notes: list[str] = []
    dup, explained = duplicates(view, ["t1", "t2", "t3"], [Fault("kill", 100, 100, 7)], notes)
    assert (dup, explained) == (2, 1)
    assert len(notes) == 1
    assert notes[0].startswith("t2:")


def test_a_stall_explains_the_stalled_workers_late_run() -> None:
    # Worker 5 dequeued the task, then its loop stalled; worker 6 recovered and ran it;
    # worker 5 started it only when its loop came back.
    view = LedgerView()
    view.runs["t"] = [Run("1", 6, 55.0, 55.1), Run("2", 5, 56.0, 56.1)]
    view.stalls.append(Fault("stall", 50.0, 54.5 + 2.0, 5))
    assert duplicates(view, ["t"], []) == (1, 1)
    # A late run on a worker that did not stall stays unexplained.
    view.runs["u"] = [Run("3", 6, 10.0, 10.1), Run("4", 7, 11.0, 11.1)]
    assert duplicates(view, ["u"], []) == (1, 0)


def test_a_stall_record_explains_runs_on_the_stalled_worker() -> None:
    view = LedgerView()
    view.runs["t"] = [Run("1", 5, 50.0), Run("2", 6, 60.0, 60.1)]
    view.stalls.append(Fault("stall", 49.0, 53.5, 5))
    assert duplicates(view, ["t"], []) == (1, 1)


async def test_the_proxy_drops_bytes_while_partitioned_and_heals() -> None:
    server = RedisServer().start()
    proxy = await PartitionProxy(server.port).start()
    try:
        # One retry, at once: the ping times out on the open connection, then on a new
        # one made while partitioned (redis-py's default, three retries with backoff of
        # up to seconds, adds nothing but waiting).
        through = Redis(
            host="127.0.0.1", port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 1)
        )
        assert await through.ping() is True
        proxy.partition()
        with pytest.raises(RedisTimeoutError):
            await through.ping()  # no error from the network, only silence
        proxy.heal()
        await through.aclose()
        healed = Redis(host="127.0.0.1", port=proxy.port, socket_timeout=2)
        assert await healed.ping() is True
        await healed.aclose()
    finally:
        await proxy.close()
        server.cleanup()


def test_markdown_table_from_a_result_file() -> None:
    row = {
        "scenario": "crash storm",
        "ok": True,
        "tasks": 20000,
        "kills": 28,
        "lost": 0,
        "duplicates": 72,
        "explained_duplicates": 72,
        "time_to_drain_s": 3.88,
        "duration_s": 74.74,
    }
    lines = markdown([row]).splitlines()
    assert lines[-1] == "| crash storm | 20,000 | 28 | 0 | 72 | 72 | 3.88 | 74.74 | yes |"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_quick_scenario_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "--quick", "--only", "redis-restart", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "redis restart (AOF)" in proc.stdout
    (row,) = json.loads(out.read_text())["scenarios"]
    assert row["ok"] is True
    assert row["tasks"] > 0
    assert (row["lost"], row["leftover"], row["unexplained_duplicates"]) == (0, 0, 0)
    assert row["kills"] == 1


def test_unknown_scenario_is_refused_by_name() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "--only", "no-such"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "invalid choice: 'no-such'" in proc.stderr


def test_chaos_uses_only_the_public_api() -> None:
    # Workers, producers and checks go through what a user imports: `from asyncq import ...`.
    # The one exception is the server finder of `asyncq dev` (public module asyncq.devserver),
    # which starts the Redis servers the scenarios break, not tasks.
    for path in (ROOT / "chaos").glob("*.py"):
        text = re.sub(r"from asyncq\.devserver import [\w, ]+\n", "", path.read_text())
        assert "asyncq._" not in text, path
        assert "from asyncq." not in text, path
        assert "import asyncq." not in text, path


async def test_a_stalled_drain_says_lost_when_nothing_is_in_flight(redis: Redis) -> None:
    harness = Harness("stalled", "redis://unused")
    try:
        harness.acked = {"ran": "work", "gone": "work"}
        view = LedgerView()
        view.runs["ran"].append(Run("r1", 1, 0.0, 1.0))
        conn = Connection(redis)
        why = await harness._why_stalled(conn, view, 30)
        assert why.endswith(
            "nothing is in flight: 1 acknowledged task(s) not run are not in the queue"
        )
        await redis.lpush(PREFIX + "pending", "gone")
        why = await harness._why_stalled(conn, view, 30)
        assert why == "no handler ran for 30s with 1 in flight: the workers are wedged"
    finally:
        shutil.rmtree(harness.logs)
