"""``asyncq web`` and ``asyncq metrics`` as a user runs them, and the missing-extra hint."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from tests.support import webdata
from tests.support.redis_server import free_port


def _serve(cmd: list[str], ready: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Start *cmd* and read its output until the line containing *ready* (both commands
    print their address once they listen); the process and the lines read so far."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    said: list[str] = []
    for line in proc.stdout:  # end of file: the process exited
        said.append(line)
        if ready in line:
            return proc, said
    proc.wait()
    raise AssertionError(f"{cmd} did not start: {''.join(said)}")


def _stop(proc: subprocess.Popen[str], said: list[str]) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return "".join(said) + out


async def test_metrics_command_serves_asynq_names(redis_url: str, redis: Redis) -> None:
    await webdata.seed(redis)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "asyncq.cli", "metrics", "--uri", redis_url, "--port", str(port)]
    proc, said = _serve(cmd, "asyncq metrics on ")
    try:
        async with httpx.AsyncClient(timeout=30) as h:  # the first waits out start-up
            text = (await h.get(base + "/metrics")).text
    finally:
        out = _stop(proc, said)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"asynq_queue_size", "asynq_tasks_enqueued_total", "asynq_tasks_processed"} <= names
    assert f"http://127.0.0.1:{port}/metrics" in out


async def test_web_command_guards_localhost_against_rebinding(redis_url: str, redis: Redis) -> None:
    await webdata.seed(redis)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc, said = _serve(
        [sys.executable, "-m", "asyncq.cli", "--uri", redis_url, "web", "--port", str(port)],
        "asyncq web on ",
    )
    try:
        async with httpx.AsyncClient(timeout=30) as h:  # the first waits out start-up
            assert (await h.get(base + "/api/queues")).status_code == 200
            rebound = await h.get(base + "/api/queues", headers={"Host": f"evil.example:{port}"})
            assert rebound.status_code == 400
            local = await h.get(base + "/", headers={"Host": f"localhost:{port}"})
            assert local.status_code == 200
    finally:
        _stop(proc, said)


def test_missing_extra_names_the_install_command() -> None:
    code = (
        "import sys; sys.modules['starlette'] = None; sys.modules['uvicorn'] = None\n"
        "from asyncq.cli import main\n"
        "main(['web'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert "pip install 'asyncq[web]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_web_refuses_bad_auth_options() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "asyncq.cli", "web", "--username", "admin"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "both a username and a password" in proc.stderr


@pytest.mark.parametrize("command", ["web", "metrics"])
def test_help(command: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "asyncq.cli", command, "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert "--port" in proc.stdout
