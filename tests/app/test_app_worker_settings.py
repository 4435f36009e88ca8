"""Worker settings carried by the App: typed, layered, and every one reaching the Server."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import redis as sync_redis
from structlog.testing import capture_logs

import asyncq.app as app_module
from asyncq import Aggregation, App, Intervals, Limits, Server
from asyncq._worker.config import GROUPED_OPTION_NAMES, SERVER_OPTION_NAMES
from asyncq.app import WORKER_OPTION_NAMES, WorkerOptions
from asyncq.hooks import WorkerHooks

ROOT = Path(__file__).resolve().parents[2]


def _retry_delay(n: int, exc: BaseException, task: Any) -> timedelta:
    return timedelta(seconds=n)


def _is_failure(exc: BaseException) -> bool:
    return False


def _error_handler(task: Any, exc: BaseException) -> None:
    return None


def _health_check(exc: BaseException | None) -> None:
    return None


def _aggregate(group: str, tasks: Any) -> Any:
    return tasks[0]


# One value per option, none of them Server's default, so a dropped option shows.
EVERY_OPTION: WorkerOptions = {
    "concurrency": 7,
    "queues": {"email": 3, "partner": 1},
    "strict_priority": True,
    "lease_duration": timedelta(seconds=45),
    "shutdown_timeout": timedelta(seconds=25),
    "retry_delay": _retry_delay,
    "is_failure": _is_failure,
    "error_handler": _error_handler,
    "health_check": _health_check,
    "burst": True,
    "logger": object(),
    "metrics": cast(WorkerHooks, object()),
    "metrics_history": timedelta(hours=2),
    "events": ["default"],
    "min_replicas": 1,
    "replica_timeout": timedelta(seconds=2),
    "intervals": Intervals(
        heartbeat=timedelta(seconds=3),
        recoverer=timedelta(seconds=20),
        recoverer_cutoff=timedelta(seconds=9),
        health_check=timedelta(seconds=30),
        task_check=timedelta(milliseconds=300),
        delayed_task_check=timedelta(seconds=2),
        janitor=timedelta(seconds=4),
        queue_refresh=timedelta(seconds=2),
    ),
    "limits": Limits(
        queue_concurrency={"partner": 2},
        local_queue_concurrency={"email": 4},
        rate_limits={"partner": "10/s"},
        type_rate_limits={"api:call": "600/min"},
        ordered_queues=["ledger"],
        janitor_batch_size=50,
        sync_concurrency=3,
        max_inflight_bytes=1024,
    ),
    "aggregation": Aggregation(
        aggregator=_aggregate,
        grace_period=timedelta(seconds=5),
        max_delay=timedelta(seconds=50),
        max_size=20,
        check_interval=timedelta(seconds=2),
    ),
}


def test_worker_options_name_every_server_option_but_the_target_and_lifespan() -> None:
    params = inspect.signature(Server.__init__).parameters
    # The named keywords, and the settings (**options: ServerOptions).
    server_options = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    server_options |= SERVER_OPTION_NAMES
    assert server_options - {"lifespan"} == set(WORKER_OPTION_NAMES)
    # The table below covers them all, the deprecated flat ones by their groups.
    assert set(EVERY_OPTION) | GROUPED_OPTION_NAMES == set(WORKER_OPTION_NAMES)


class _Recording:
    seen: list[tuple[Any, dict[str, Any]]]

    def __init__(self, redis: Any, **options: Any) -> None:
        self.seen.append((redis, options))
        self.config = type("Config", (), {"queues": options["queues"]})()


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, dict[str, Any]]]:
    """The (redis, options) of every Server the App makes (none is made)."""
    seen: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(app_module, "Server", type("Recording", (_Recording,), {"seen": seen}))
    return seen


def test_every_app_setting_reaches_the_server(
    recorded: list[tuple[Any, dict[str, Any]]],
) -> None:
    async def lifespan_cm() -> Any:
        yield None

    from contextlib import asynccontextmanager

    lifespan = asynccontextmanager(lifespan_cm)
    app = App("redis://example:6379/3", lifespan=lifespan, **EVERY_OPTION)
    app.server()
    redis, options = recorded[-1]
    assert redis == "redis://example:6379/3"
    assert options == {**EVERY_OPTION, "lifespan": lifespan}
    # A per-call option overrides its key only; the others stay the App's.
    app.server(concurrency=2, redis="redis://other:6379/0")
    redis, options = recorded[-1]
    assert redis == "redis://other:6379/0"
    assert options["concurrency"] == 2
    assert options["limits"].rate_limits == {"partner": "10/s"}
    assert options["queues"] == {"email": 3, "partner": 1}


async def test_a_real_server_gets_the_app_settings() -> None:
    app = App(
        "redis://localhost:1/0",
        concurrency=5,
        queues={"email": 3, "partner": 1},
        strict_priority=True,
        limits=Limits(
            queue_concurrency={"partner": 2},
            rate_limits={"partner": "10/s"},
            ordered_queues=["email"],
        ),
        lease_duration=timedelta(seconds=40),
        intervals=Intervals(recoverer_cutoff=timedelta(seconds=7)),
    )
    server = app.server()
    try:
        cfg = server.config
        assert cfg.concurrency == 5
        assert dict(cfg.queues) == {"email": 3, "partner": 1}
        assert cfg.strict_priority is True
        assert dict(cfg.queue_concurrency) == {"partner": 2}
        assert set(cfg.rate_limits) == {"partner"}
        assert cfg.ordered_queues == ("email",)
        assert cfg.lease_duration == 40.0
        assert cfg.recoverer_cutoff == 7.0
    finally:
        await server.shutdown()


def test_unknown_worker_option_is_refused_with_a_suggestion() -> None:
    with pytest.raises(TypeError, match=r"unknown worker option 'queue_concurency'.*"
                       r"did you mean 'queue_concurrency'"):  # fmt: skip
        App("redis://localhost:6379/0", queue_concurency={"a": 1})  # type: ignore[call-arg]
    app = App("redis://localhost:6379/0")
    with pytest.raises(TypeError, match=r"'concurency'.*'concurrency'"):
        app.server(concurency=3)  # type: ignore[call-arg]


def test_queues_default_to_every_queue_the_tasks_declare() -> None:
    app = App("redis://localhost:6379/0")

    @app.task(queue="email")
    async def welcome(user_id: int) -> None: ...

    @app.task(queue="reports:eu")
    async def report(n: int) -> None: ...

    @app.task
    async def plain() -> None: ...

    assert app.worker_settings()["queues"] == {"default": 1, "email": 1, "reports:eu": 1}
    assert app.task_queues() == {
        "email": [welcome.name],
        "reports:eu": [report.name],
        "default": [plain.name],
    }
    pinned = App("redis://localhost:6379/0", queues={"critical": 5})
    assert pinned.worker_settings()["queues"] == {"critical": 5}
    assert app.worker_settings(queues={"x": 2})["queues"] == {"x": 2}


async def test_a_worker_not_serving_a_task_queue_says_so() -> None:
    app = App("redis://localhost:1/0", queues={"default": 1, "tenant:*": 1})

    @app.task(queue="email")
    async def welcome(user_id: int) -> None: ...

    @app.task(queue="tenant:7")
    async def tenant_job() -> None: ...

    with capture_logs() as logs:
        server = app.server()
    await server.shutdown()
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [(e["queue"], e["task_types"]) for e in warnings] == [("email", [welcome.name])]
    assert "does not serve" in warnings[0]["event"]
    with capture_logs() as logs:
        served = app.server(queues={"email": 1, "tenant:*": 1, "default": 1})
    await served.shutdown()
    assert not [e for e in logs if e["log_level"] == "warning"]


TASKS = """
import os
from redis.asyncio import Redis
from asyncq import App

app = App(os.environ["TEST_REDIS_URL"], concurrency=2)


@app.task(name="mail:send", queue="mail")
async def send(to: str) -> str:
    async with Redis.from_url(os.environ["TEST_REDIS_URL"]) as r:
        await r.rpush("sent", to)
    return to
"""


@pytest.mark.subprocess
def test_cli_worker_serves_a_queue_declared_only_on_a_task(redis_url: str, tmp_path: Path) -> None:
    r = sync_redis.Redis.from_url(redis_url)
    r.flushdb()
    (tmp_path / "tasks.py").write_text(TASKS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_REDIS_URL": redis_url}
    env.pop("ASYNCQ_REDIS_URL", None)
    # Enqueued from another process (this one), before any worker runs.
    enqueue = (
        "import asyncio, tasks\n"
        "async def main():\n"
        "    async with tasks.app:\n"
        "        h = await tasks.send.enqueue('a@example.com')\n"
        "        print(h.queue)\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", enqueue],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "mail"
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncq.cli", "worker", "tasks:app", "--log-level", "info"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while r.llen("sent") == 0:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the worker never ran the mail task"
            time.sleep(0.05)
        assert r.lrange("sent", 0, -1) == [b"a@example.com"]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        r.close()
    assert proc.returncode == 0, err
    assert "does not serve" not in err
    assert "'mail': 1" in err  # the start line lists the queues served
    # A flag overrides the App: -q default leaves the mail queue unserved, and says so.
    r.flushdb()
    burst = subprocess.run(
        [sys.executable, "-m", "asyncq.cli", "worker", "tasks:app", "-q", "default", "--burst"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert burst.returncode == 0, burst.stderr
    assert "does not serve a queue that registered tasks use" in burst.stderr
    assert "mail:send" in burst.stderr
