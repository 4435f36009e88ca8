"""``asyncq worker module:app``: a real worker process on Go-written tasks."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from click.testing import CliRunner

from asyncq._worker.config import DEFAULT_METRICS_HISTORY
from asyncq.cli import main
from asyncq.cli.worker import parse_queues
from tests.support import gofixtures as go
from tests.support.gofixtures import GoTask

ROOT = Path(__file__).resolve().parents[2]

APP = """
import os
from redis.asyncio import Redis
from asyncq.mux import ServeMux

mux = ServeMux()

@mux.handler("echo")
async def echo(task):
    async with Redis.from_url(os.environ["TEST_REDIS_URL"]) as r:
        await r.rpush("handled", task.payload)

def make_mux():
    return mux

not_a_mux = 42
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "myapp.py").write_text(APP)
    return tmp_path


def worker_cmd(redis_url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "asyncq.cli", "-u", redis_url, "worker", *args]


def worker_env(redis_url: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_REDIS_URL": redis_url}
    env.pop("ASYNCQ_REDIS_URL", None)
    return env


def seed_go_tasks(redis_url: str, queue: str, payloads: list[bytes]) -> None:
    async def fill() -> None:
        from redis.asyncio import Redis

        async with Redis.from_url(redis_url) as rr:
            for p in payloads:
                await go.enqueue(rr, GoTask("echo", p, queue=queue), datetime.now(UTC))

    asyncio.run(fill())


@pytest.mark.subprocess
def test_burst_processes_go_tasks_and_exits(
    redis_url: str, r: sync_redis.Redis, app_dir: Path
) -> None:
    seed_go_tasks(redis_url, "critical", [b"c1", b"c2"])
    seed_go_tasks(redis_url, "default", [b"d1"])
    proc = subprocess.run(
        worker_cmd(
            redis_url,
            "myapp:mux",
            "--burst",
            "-c",
            "2",
            "-q",
            "critical=6,default=3",
            "--log-level",
            "warning",
        ),
        cwd=app_dir,
        env=worker_env(redis_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(r.lrange("handled", 0, -1)) == [b"c1", b"c2", b"d1"]
    assert r.llen("asynq:{critical}:pending") == 0 and r.llen("asynq:{default}:pending") == 0
    assert int(r.get("asynq:{critical}:processed")) == 2
    assert "Traceback" not in proc.stderr


@pytest.mark.subprocess
def test_worker_shows_in_server_ls_and_stops_on_sigterm(
    redis_url: str, r: sync_redis.Redis, app_dir: Path
) -> None:
    proc = subprocess.Popen(
        worker_cmd(redis_url, "myapp:make_mux", "-c", "3", "--strict"),
        cwd=app_dir,
        env=worker_env(redis_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120  # bounds for a busy machine, not speed checks
        runner = CliRunner(env={"COLUMNS": "80"})
        # The server's record is written just after its id enters asynq:servers: wait
        # until `server ls` shows it.
        while True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker never sent a heartbeat"
            result = runner.invoke(main, ["-u", redis_url, "server", "ls", "--json"])
            assert result.exit_code == 0, result.output
            if json.loads(result.stdout):
                break
            time.sleep(0.05)
        (server,) = json.loads(result.stdout)
        assert server["pid"] == proc.pid and server["concurrency"] == 3
        assert server["strict_priority"] is True and server["status"] == "active"
        seed_go_tasks(redis_url, "default", [b"live"])
        while r.llen("handled") == 0:
            assert time.monotonic() < deadline, "the running worker did not take the task"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert r.zcard("asynq:servers") == 0  # the server removed its own record


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nosuchmodule:app"], "cannot import module 'nosuchmodule': no module named"),
        (["myapp:nope"], "module 'myapp' has no attribute 'nope'"),
        (["myapp:not_a_mux"], "myapp:not_a_mux is a int; expected an asyncq App or ServeMux"),
        (["os:getcwd"], "os:getcwd returned str, expected an asyncq App or ServeMux"),
        (["myapp:"], "module 'myapp' has no attribute 'app'"),
        ([":mux"], "invalid app ':mux'"),
        (["myapp:mux", "-q", "critical=x"], "invalid priority 'x' for queue 'critical'"),
        (["myapp:mux", "-q", "a=0"], "priority of queue 'a' must be 1 or more"),
        (["myapp:mux", "-c", "0"], "Invalid value for '--concurrency'"),
    ],
)
def test_bad_worker_arguments(
    redis_url: str, app_dir: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], needle: str
) -> None:
    monkeypatch.chdir(app_dir)
    monkeypatch.syspath_prepend(str(app_dir))
    result = CliRunner().invoke(main, ["-u", redis_url, "worker", *args])
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_worker_unreachable_redis(app_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.redis_server import free_port

    monkeypatch.syspath_prepend(str(app_dir))
    uri = f"redis://127.0.0.1:{free_port()}/0"
    result = CliRunner().invoke(main, ["worker", "myapp:mux", "--burst", "-u", uri])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(f"error: cannot connect to Redis at {uri}")


def test_parse_queues() -> None:
    assert parse_queues("critical=6, default=3,low") == {"critical": 6, "default": 3, "low": 1}
    with pytest.raises(ValueError, match="listed twice"):
        parse_queues("a,a=2")
    with pytest.raises(ValueError, match="empty queue name"):
        parse_queues("a,,b")


def test_lease_and_recovery_flags_reach_the_server(
    r: sync_redis.Redis, redis_url: str, app_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncq._worker.server

    configs = []

    class Recording(asyncq._worker.server.Server):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            configs.append(self.config)

    monkeypatch.setattr(asyncq._worker.server, "Server", Recording)
    monkeypatch.chdir(app_dir)
    monkeypatch.syspath_prepend(str(app_dir))
    flags = ["--lease-duration", "12s", "--heartbeat-interval", "2s"]
    flags += ["--recoverer-interval", "20s", "--recoverer-cutoff", "500ms"]
    result = CliRunner().invoke(main, ["-u", redis_url, "worker", "myapp:mux", "--burst", *flags])
    assert result.exit_code == 0, result.output
    (cfg,) = configs
    timings = (cfg.lease_duration, cfg.heartbeat_interval, cfg.recoverer_interval)
    assert timings == (12, 2, 20)
    assert cfg.recoverer_cutoff == 0.5


@pytest.mark.parametrize(
    ("flags", "kept"),
    [
        ([], DEFAULT_METRICS_HISTORY),
        (["--metrics-history"], True),
        (["--no-metrics-history"], False),
    ],
)
def test_metrics_history_flag_reaches_the_server(
    r: sync_redis.Redis,  # a flushed database: leftovers would keep the burst worker busy
    redis_url: str,
    app_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    kept: bool,
) -> None:
    import asyncq._worker.server

    servers: list[asyncq._worker.server.Server] = []

    class Recording(asyncq._worker.server.Server):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            servers.append(self)

    monkeypatch.setattr(asyncq._worker.server, "Server", Recording)
    monkeypatch.chdir(app_dir)
    monkeypatch.syspath_prepend(str(app_dir))
    result = CliRunner().invoke(main, ["-u", redis_url, "worker", "myapp:mux", "--burst", *flags])
    assert result.exit_code == 0, result.output
    (server,) = servers
    if kept:
        assert server.config.metrics_history == timedelta(hours=24)
        assert server.history is not None and server.history.retention == timedelta(hours=24)
    else:
        assert server.config.metrics_history is None and server.history is None


@pytest.mark.parametrize("flag", ["--metrics-history", "--no-metrics-history"])
def test_metrics_history_flag_reaches_supervised_workers(
    redis_url: str, app_dir: Path, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    # the module, not the command of the same name that asyncq.cli exports
    worker_module = importlib.import_module("asyncq.cli.worker")
    started: list[list[str]] = []

    class Supervisor:
        cannot_connect = False

        def __init__(self, argv: list[str], processes: int, **kwargs: Any) -> None:
            started.append(argv)

        async def run(self) -> int:
            return 0

    monkeypatch.setattr(worker_module, "Supervisor", Supervisor)
    monkeypatch.chdir(app_dir)
    args = ["-u", redis_url, "worker", "myapp:mux", "--processes", "2", flag]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (argv,) = started
    other = "--metrics-history" if flag == "--no-metrics-history" else "--no-metrics-history"
    assert argv.count(flag) == 1 and other not in argv


def test_heartbeat_not_shorter_than_the_lease_is_refused(
    redis_url: str, app_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(app_dir)
    monkeypatch.syspath_prepend(str(app_dir))
    args = ["-u", redis_url, "worker", "myapp:mux", "--burst", "--lease-duration", "5s"]
    result = CliRunner().invoke(main, [*args, "--heartbeat-interval", "5s"])
    assert result.exit_code != 0
    assert "must be longer than intervals.heartbeat" in result.stderr, result.stderr
