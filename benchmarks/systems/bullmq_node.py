"""BullMQ for Node: ``python -m benchmarks.systems.bullmq_node --url redis://...``.

This script is the driver (the same phases, Redis meters and records as every other
system); BullMQ itself runs in ``node benchmarks/node/bench.mjs``: one long-lived
``producer`` process per enqueue phase, which runs the timed loops itself and answers
over a pipe, and a ``worker`` process per processing and latency phase, which prints
the same records as a Python worker. So the pipe and this interpreter's CPU are in no
figure. Needs ``node`` on PATH and ``benchmarks/node/node_modules`` (the runner runs
``npm ci`` there from the committed lock file). Standard library only.

BullMQ is used as its README shows, with its defaults: ``new Queue(name, {connection})``
and ``queue.add("noop", {i})``, ``queue.addBulk`` as the batch path, ``new Worker(name,
processor, {connection, concurrency: 100})``; completed jobs are kept.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from benchmarks.systems._common import Config, Producer, System, Timed, main

NODE_DIR = Path(__file__).resolve().parent.parent / "node"
SCRIPT = NODE_DIR / "bench.mjs"
REPLY_LIMIT = 64 * 2**20  # one reply carries up to N per-call latencies as JSON


def node_binary() -> str:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not on PATH")
    return node


class NodeProducer(Producer):
    """A ``bench.mjs producer`` process: one JSON request per line, one reply per line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the node producer exited during {op!r}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"node producer, {op}: {reply['error']}")
        return reply

    async def enqueue(self, i: int) -> None:
        await self.request("enqueue", i=i)

    async def timed_calls(self, indices: Sequence[int], callers: int) -> Timed:
        r = await self.request("timed", indices=list(indices), callers=callers)
        return Timed(r["seconds"], r["cpu_s"], r["latencies"])

    async def timed_fast(self, indices: Sequence[int], cfg: Config) -> Timed:
        r = await self.request("fast", indices=list(indices), batch_size=cfg.batch_size)
        return Timed(r["seconds"], r["cpu_s"], errors=r["errors"])

    async def paced(
        self, warmup: Sequence[int], indices: Sequence[int], interval: float, idle: float
    ) -> dict[int, tuple[float, float]]:
        r = await self.request(
            "paced", warmup=list(warmup), indices=list(indices), interval=interval, idle=idle
        )
        return {int(i): (b, a) for i, (b, a) in r["sent"].items()}


class BullmqNode(System):
    name = "bullmq-node"
    fast_path = "Queue.addBulk() (one MULTI/EXEC pipeline per batch)"
    retention = "every completed job kept, without TTL (removeOnComplete off by default)"

    def versions(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for package in ("bullmq", "ioredis"):
            manifest = NODE_DIR / "node_modules" / package / "package.json"
            try:
                out[package] = json.loads(manifest.read_text())["version"]
            except (OSError, ValueError, KeyError):
                out[package] = "?"
        try:
            out["node"] = subprocess.run(
                [node_binary(), "--version"], capture_output=True, text=True, timeout=10,
                check=True,
            ).stdout.strip().removeprefix("v")  # fmt: skip
        except (OSError, RuntimeError, subprocess.SubprocessError):
            out["node"] = "?"
        return out

    @asynccontextmanager
    async def producer(self, cfg: Config) -> AsyncIterator[Producer]:
        proc = await asyncio.create_subprocess_exec(
            node_binary(), str(SCRIPT), "producer", "--url", cfg.url,
            cwd=NODE_DIR, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=REPLY_LIMIT,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            ready = await asyncio.wait_for(proc.stdout.readline(), 60)
            if json.loads(ready or b"{}").get("event") != "ready":
                raise RuntimeError(f"the node producer did not start: {ready!r}")
            yield NodeProducer(proc)
            proc.stdin.write(b'{"op": "close"}\n')
            proc.stdin.close()
            await asyncio.wait_for(proc.wait(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    def worker_command(self, module: str, mode: str, cfg_json: str) -> list[str]:
        # the worker is BullMQ's own Worker in node; serve() is never called for this system
        return [node_binary(), str(SCRIPT), "worker", "--mode", mode, "--config", cfg_json]


if __name__ == "__main__":
    main(BullmqNode())
