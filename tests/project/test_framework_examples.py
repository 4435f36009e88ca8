"""The FastAPI and Flask examples, against a real worker process (``asyncq worker tasks:app``)."""

from __future__ import annotations

import importlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis as sync_redis

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "typed"

pytestmark = pytest.mark.xdist_group("framework-examples")


@pytest.fixture
def worker(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    r = sync_redis.Redis.from_url(redis_url)
    r.flushdb()
    r.close()
    monkeypatch.setenv("ASYNCQ_REDIS_URL", redis_url)  # what every example reads
    monkeypatch.syspath_prepend(str(EXAMPLES))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncq.cli", "worker", "tasks:app", "-q", "reports", "-c", "4"],
        cwd=EXAMPLES, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, bufsize=0,
    )  # fmt: skip
    try:
        wait_ready(proc)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        for name in ("tasks", "fastapi_app", "flask_app"):
            sys.modules.pop(name, None)
    assert proc.returncode == 0, err.decode()


READY = b"send signal TERM or INT"  # logged once the worker's signal handlers are installed


def wait_ready(proc: subprocess.Popen[bytes], within: float = 60.0) -> None:
    """Read the worker's log until it can take a SIGTERM (before that, one kills it).

    The pipe is unbuffered (bufsize=0), so select() sees every line not yet read.
    """
    assert proc.stderr is not None
    deadline = time.monotonic() + within
    seen = b""
    while READY not in seen:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if not line:
                raise AssertionError(f"the worker exited before it was ready: {seen.decode()}")
            seen += line
        assert time.monotonic() < deadline, f"the worker was not ready: {seen.decode()}"


def fresh(name: str) -> ModuleType:
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_fastapi_enqueues_and_awaits(worker: None) -> None:
    from fastapi.testclient import TestClient

    example = fresh("fastapi_app")
    with TestClient(example.api) as http:
        accepted = http.post("/reports", json={"user_id": 3, "days": 2})
        assert accepted.status_code == 202
        task_id = accepted.json()["task_id"]
        report = http.get(f"/reports/{task_id}", params={"wait": 30})
        assert report.status_code == 200, report.text
        body = report.json()
        assert (body["user_id"], body["days"]) == (3, 2)
        assert body["generated_by"].startswith("worker-")  # the worker's lifespan state
        assert body["total"] == round((1.0 + 1.1) * 3, 2)

        bad = http.post("/reports", json={"user_id": 3, "days": 99})
        failed = http.get(f"/reports/{bad.json()['task_id']}", params={"wait": 30})
        assert failed.status_code == 422
        assert "days must be between 1 and 30, got 99" in failed.json()["detail"]
        assert http.get("/reports/no-such-id", params={"wait": 1}).status_code == 404


def test_flask_with_the_sync_client(worker: None) -> None:
    example = fresh("flask_app")
    try:
        http = example.app.test_client()
        accepted = http.post("/reports", json={"user_id": 2, "days": 1})
        assert accepted.status_code == 202
        task_id = accepted.get_json()["task_id"]
        report = http.get(f"/reports/{task_id}?wait=30")
        assert report.status_code == 200, report.get_data(as_text=True)
        assert report.get_json()["total"] == 2.0
        refused = http.post("/reports", json={"user_id": "two"})
        assert refused.status_code == 400
        assert "argument 'user_id'" in refused.get_json()["error"]
        assert http.get("/reports/no-such-id?wait=1").status_code == 404
    finally:
        example.client.close()
