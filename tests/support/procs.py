"""Helpers shared by the worker-runtime tests and their subprocess scripts."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
from redis.asyncio import Redis

from asyncq import Intervals
from asyncq import _keys as keys
from asyncq.proto.asynq import TaskMessage
from tests.support.helpers import wait_until

__all__ = ["FAST", "FAST_INTERVALS", "fast", "spawn", "stop_process", "wait_for_line", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"

FAST_INTERVALS = Intervals(
    task_check=timedelta(milliseconds=100),
    delayed_task_check=timedelta(milliseconds=100),
    heartbeat=timedelta(milliseconds=200),
    recoverer=timedelta(milliseconds=200),
    janitor=timedelta(milliseconds=200),
)
"""The intervals of :data:`FAST`."""

FAST: dict[str, Any] = {"intervals": FAST_INTERVALS, "shutdown_timeout": timedelta(seconds=2)}
"""Server timings that keep the tests fast."""


def fast(**intervals: timedelta) -> dict[str, Any]:
    """:data:`FAST` with some of its intervals changed (``Intervals`` field names)."""
    return {**FAST, "intervals": replace(FAST_INTERVALS, **intervals)}


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
    """Start ``tests/support/workers/<script>`` with the project on the path; stdout is piped."""
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


def drain(proc: subprocess.Popen[str], keep: int = 200) -> collections.deque[str]:
    """Read the child's stdout and stderr from now on, keeping the last *keep* lines.

    A worker that logs every task fills a pipe nobody reads (64 KiB) and then
    blocks in ``print``, event loop and all: it could no longer shut down.
    Call this once the lines a test waits for have been read.
    """
    tail: collections.deque[str] = collections.deque(maxlen=keep)

    def pump(stream: Any) -> None:
        with contextlib.suppress(ValueError, OSError):  # closed by stop_process
            for line in stream:
                tail.append(line)

    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            threading.Thread(target=pump, args=(stream,), daemon=True).start()
    return tail


def stop_process(proc: subprocess.Popen[str], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def args_for(options: dict[str, Any]) -> Sequence[str]:
    return [f"{k}={v}" for k, v in options.items()]
