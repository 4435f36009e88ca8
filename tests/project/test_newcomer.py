"""What a newcomer runs into when trying the project fresh: each item has a check here."""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
import redis as sync_redis
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import Aggregation, Client, EnqueueOptions, ServeMux, Server, Task
from asyncq import _keys as keys
from asyncq.cli import main
from tests.support.procs import FAST, wait_until
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def example_env(redis_url: str, port: int | None = None) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ASYNCQ_REDIS_URL": redis_url}
    env["PORT"] = str(port if port is not None else free_port())
    env.pop("REDIS_URL", None)
    return env


# --- every example reads ASYNCQ_REDIS_URL --------------------------------------------------


def test_examples_read_only_asyncq_redis_url() -> None:
    for path in sorted(EXAMPLES.glob("*.py")):
        text = path.read_text()
        names = set(re.findall(r"environ(?:\.get\(|\[)\s*['\"]([A-Z_]*REDIS[A-Z_]*)['\"]", text))
        assert names <= {"ASYNCQ_REDIS_URL"}, f"{path.name} reads {names}"


@pytest.mark.slow
def test_periodic_example_uses_asyncq_redis_url(redis_url: str) -> None:
    r = sync_redis.Redis.from_url(redis_url)
    r.flushdb()
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "periodic.py"), "--seconds", "20"],
        env=example_env(redis_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while r.zcard("asynq:schedulers") == 0:  # its heartbeat, in the test's Redis
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "periodic.py did not use ASYNCQ_REDIS_URL"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        r.close()


# --- examples/webapp.py: a taken port, and SIGTERM ---------------------------------------


def test_webapp_reports_a_taken_port_not_redis(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, str(EXAMPLES / "webapp.py"), "--self-test"],
            env=example_env(redis_url, port),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert f"cannot listen on http://127.0.0.1:{port}" in result.stderr
    assert "Redis" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_webapp_shuts_down_gracefully_on_sigterm(redis_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "webapp.py")],
        env=example_env(redis_url, 0),  # any free port
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "webapp.py did not start listening within 60 s"
        line = proc.stdout.readline()
        assert "listening on" in line, proc.communicate()
        proc.send_signal(signal.SIGTERM)  # what `docker stop` sends
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "shutting down" in out and "Traceback" not in err


# --- asyncq worker: the MODULE:APP form ---------------------------------------------------


@pytest.fixture
def tasks_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "newtasks.py").write_text("from asyncq import ServeMux\n\nmux = ServeMux()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("newtasks", None)


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("newtasks", "no attribute 'app'; it has a ServeMux: use newtasks:mux"),
        ("newtasks.py:mux", "give a module name, not a file path (e.g. newtasks:mux"),
        ("./newtasks.py", "give a module name, not a file path (e.g. newtasks:app"),
        ("newtasks:muxx", "it has a ServeMux: use newtasks:mux"),
    ],
)
def test_worker_app_errors_show_the_module_app_form(
    tasks_dir: Path, spec: str, expected: str
) -> None:
    code, err = run_cli("worker", spec)
    assert code == 1
    assert expected in err, err
    assert len(err.strip().splitlines()) == 1


def test_worker_app_hint_without_a_mux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nomux.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        code, err = run_cli("worker", "nomux")
    finally:
        sys.modules.pop("nomux", None)
    assert code == 1
    assert "give the ServeMux as MODULE:APP, e.g. nomux:mux" in err


# --- an unknown enqueue option suggests the near one --------------------------------------


@pytest.mark.parametrize(
    ("wrong", "right"),
    [
        ("retries", "max_retry"),
        ("max_retries", "max_retry"),
        ("countdown", "process_in"),
        ("proces_in", "process_in"),
        ("queu", "queue"),
        ("id", "task_id"),
        ("deadlin", "deadline"),
    ],
)
async def test_unknown_enqueue_option_suggests_the_near_one(
    client: Client, wrong: str, right: str
) -> None:
    with pytest.raises(TypeError, match=f"'{wrong}': did you mean '{right}'") as caught:
        await client.enqueue(Task("x"), **{wrong: 3})  # type: ignore[arg-type]
    assert "(known: " in str(caught.value)  # the full list is still given


async def test_unknown_option_on_a_task_and_in_a_batch(client: Client) -> None:
    with pytest.raises(TypeError, match="did you mean 'max_retry'"):
        await client.enqueue(Task("x", retries=3))  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="did you mean 'max_retry'"):
        await client.enqueue_many([Task("x")], retries=3)  # type: ignore[call-arg]


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12))
def test_suggestions_are_always_real_options(name: str) -> None:
    from asyncq._suggest import ENQUEUE_OPTION_ALIASES, suggest

    known = set(EnqueueOptions.__annotations__)
    near = suggest(name, known, ENQUEUE_OPTION_ALIASES)
    assert near is None or near in known


# --- asyncq task ls: full values when piped ----------------------------------------------


def test_task_ls_prints_full_values_when_not_a_terminal(redis_url: str) -> None:
    long_payload = '{"url": "' + "https://example.com/" + "x" * 150 + '"}'

    async def seed() -> None:
        async with Client(redis_url) as c:
            await c.enqueue(Task("webhook:send", long_payload.encode()), queue="wide")

    sync_redis.Redis.from_url(redis_url).flushdb()
    asyncio.run(seed())
    piped = CliRunner(env={"COLUMNS": None, "HOME": "/nonexistent"}).invoke(
        main, ["-u", redis_url, "task", "ls", "-q", "wide", "-s", "pending"]
    )
    assert piped.exit_code == 0, piped.output
    assert long_payload in piped.stdout
    assert "…" not in piped.stdout
    narrow = CliRunner(env={"COLUMNS": "80"}).invoke(
        main, ["-u", redis_url, "task", "ls", "-q", "wide", "-s", "pending"]
    )
    assert all(len(line) <= 80 for line in narrow.stdout.splitlines())
    assert "…" in narrow.stdout


# --- aggregation: the documented order of a group's tasks --------------------------------


async def test_aggregated_tasks_come_in_joining_second_then_id_order(
    redis: Redis, client: Client
) -> None:
    received: list[list[str]] = []

    async def aggregate(group: str, tasks: Sequence[Task]) -> Task:
        received.append([t.id or "" for t in tasks])
        return Task("batch")

    mux = ServeMux()

    async def batch(task: Task) -> None:
        return None

    mux.handle("batch", batch)
    ids = ["t-9", "t-5", "t-7", "t-1", "t-3"]  # enqueued in an order the ids do not sort in
    for task_id in ids:
        await client.enqueue(Task("item"), group="g", task_id=task_id)
    scored = await redis.zrange(keys.group_key("default", "g"), 0, -1, withscores=True)
    expected = [m.decode() for m, _ in sorted(scored, key=lambda ms: (ms[1], ms[0]))]
    server = Server(
        redis,
        **FAST,
        aggregation=Aggregation(
            aggregator=aggregate, max_size=5, check_interval=timedelta(milliseconds=100)
        ),
    )
    async with server:
        await server.start(mux)
        await wait_until(lambda: received, what="the aggregator to be called")
    assert received == [expected]


# --- unconfigured structlog: no debug lines at startup -----------------------------------

QUIET_WORKER = """
import asyncio, sys
from datetime import timedelta
from asyncq import Client, Intervals, ServeMux, Server, Task

async def main(url):
    mux = ServeMux()
    async def job(task):
        return None
    mux.handle("job", job)
    async with Client(url) as client:
        await client.enqueue(Task("job"))
    server = Server(url, burst=True, intervals=Intervals(task_check=timedelta(milliseconds=100)))
    await server.run(mux)
    print("done")

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.slow
def test_an_unconfigured_app_gets_no_debug_lines(redis_url: str) -> None:
    sync_redis.Redis.from_url(redis_url).flushdb()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ASYNCQ_LOG_LEVEL", None)
    result = subprocess.run(
        [sys.executable, "-c", QUIET_WORKER, redis_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout
    assert "[debug" not in result.stdout + result.stderr
