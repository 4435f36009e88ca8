"""Helpers shared by the worker-runtime tests and their subprocess scripts."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq.proto.asynq import TaskMessage

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent

FAST: dict[str, Any] = {
    "task_check_interval": timedelta(milliseconds=100),
    "delayed_task_check_interval": timedelta(milliseconds=100),
    "heartbeat_interval": timedelta(milliseconds=200),
    "recoverer_interval": timedelta(milliseconds=200),
    "janitor_interval": timedelta(milliseconds=200),
    "syncer_interval": timedelta(milliseconds=200),
    "shutdown_timeout": timedelta(seconds=2),
}
"""Server timings that keep the tests fast."""


async def wait_until(
    predicate: Callable[[], Any | Awaitable[Any]],
    *,
    within: float = 10.0,
    interval: float = 0.01,
    what: str = "condition",
) -> Any:
    """Poll *predicate* (sync or async) until it returns a truthy value (at most *within* s)."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)


async def task_hash(redis: Redis, queue: str, task_id: str) -> dict[bytes, bytes]:
    """The task hash ``asynq:{q}:t:<id>`` (empty when the task is gone)."""
    return await redis.hgetall(keys.task_key(queue, task_id))


async def stored_message(redis: Redis, queue: str, task_id: str) -> TaskMessage:
    raw = await redis.hget(keys.task_key(queue, task_id), "msg")
    assert raw is not None, f"task {task_id} has no hash"
    return TaskMessage.parse(raw)


async def zset_ids(redis: Redis, key: str) -> list[str]:
    return [m.decode() for m in await redis.zrange(key, 0, -1)]


async def list_ids(redis: Redis, key: str) -> list[str]:
    return [m.decode() for m in await redis.lrange(key, 0, -1)]


def quiet_logging(level: int = logging.INFO) -> None:
    """Filter structlog below *level* (subprocess workers, high-volume tests)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))


def spawn(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``tests/workers/<script>`` with the project on the path; stdout is piped."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.Popen(
        [sys.executable, str(WORKERS / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=ROOT,
    )


async def wait_for_line(proc: subprocess.Popen[str], expected: str, within: float = 20.0) -> None:
    """Read the child's stdout until a line containing *expected*."""
    assert proc.stdout is not None
    stdout = proc.stdout

    def read() -> str:
        while True:
            line = stdout.readline()
            if not line:
                return ""
            if expected in line:
                return line

    try:
        line = await asyncio.wait_for(asyncio.to_thread(read), within)
    except TimeoutError:
        proc.kill()
        raise AssertionError(f"worker did not print {expected!r} in {within}s") from None
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"worker exited before printing {expected!r}: {err[-3000:]}")


def stop_process(proc: subprocess.Popen[str], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def args_for(options: dict[str, Any]) -> Sequence[str]:
    return [f"{k}={v}" for k, v in options.items()]
