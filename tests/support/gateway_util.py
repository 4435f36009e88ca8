"""Helpers for the gateway tests: a real ``asyncq gateway`` process and in-loop HTTP servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    for name in ("ASYNCQ_REDIS_URL", "ASYNCQ_GATEWAY_TOKEN", "ASYNCQ_HTTP_TARGET_SECRET"):
        if name not in extra:
            env.pop(name, None)
    return env


def wait_http(url: str, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    """Poll *url* until anything answers; fail with the process's output if it died."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process exited with {proc.returncode}: {out}\n{err}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not answer within {timeout}s") from None
            time.sleep(0.05)


@contextlib.contextmanager
def gateway_process(redis_url: str, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``asyncq gateway`` on a free loopback port; yields its base URL and the process."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "asyncq.cli",
            "-u",
            redis_url,
            "gateway",
            "--port",
            str(port),
            *args,
        ],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/api/openapi.json", proc)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=30)


@contextlib.asynccontextmanager
async def serve_in_loop(app: Any) -> AsyncIterator[str]:
    """Serve the ASGI *app* with uvicorn on a free port in this event loop; yields its URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
