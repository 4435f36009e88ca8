"""asyncq (this project): ``python -m benchmarks.systems.asyncq --url redis://...``.

Runs in the project's own environment (no separate virtualenv). Tasks are
``Task("noop", b"<index>")`` on the ``default`` queue with asyncq's defaults (no
retention: a finished task's hash is deleted, as in Go asynq). Over TCP, like every
peer; ``--variant socket`` (the runner's extra row, ``asyncq-socket``) adds asyncq's
opt-in ``?local_socket=true``, which moves the hot-path connections to the local
server's unix socket. The worker keeps its metrics history (on by default);
``--variant no-history`` turns it off (``Server(metrics_history=False)``), to measure
what the history costs.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog

# The package's public names, not their modules: `python -m benchmarks.ab` runs this
# script against older revisions too, whose modules had other paths (asyncq.client).
from asyncq import Client, ServeMux, Server, Task
from benchmarks.systems._common import Config, Producer, System, main

QUEUE = "default"


VARIANTS = ("", "socket", "no-history")


def _url(cfg: Config) -> str:
    """The URL as given (TCP), or with asyncq's opt-in for a local Redis's unix socket."""
    if cfg.variant not in VARIANTS:
        raise ValueError(f"unknown asyncq variant {cfg.variant!r}; known: {VARIANTS}")
    if cfg.variant == "socket":
        return cfg.url + ("&" if "?" in cfg.url else "?") + "local_socket=true"
    return cfg.url


class AsyncqProducer(Producer):
    def __init__(self, client: Client) -> None:
        self.client = client

    async def enqueue(self, i: int) -> None:
        await self.client.enqueue(Task("noop", b"%d" % i), queue=QUEUE)

    async def enqueue_fast(self, indices: Sequence[int], cfg: Config) -> int:
        size = cfg.batch_size or len(indices)
        for start in range(0, len(indices), size):
            tasks = [Task("noop", b"%d" % i) for i in indices[start : start + size]]
            for result in await self.client.enqueue_many(tasks, queue=QUEUE):
                if isinstance(result, Exception):
                    raise RuntimeError(f"enqueue_many failed for an item: {result!r}") from result
        return 0


class Asyncq(System):
    name = "asyncq"
    fast_path = "Client.enqueue_many() (one pipeline per batch)"
    retention = "none by default: a task's hash is deleted on success (asynq semantics)"
    distributions = ("asyncq", "redis")

    def versions(self) -> dict[str, str]:
        out = super().versions()
        # a source checkout is not always installed as a distribution: name the commit too
        here = Path(__file__).resolve().parent
        try:
            commit = subprocess.run(
                ["git", "describe", "--always", "--dirty"],
                cwd=here, capture_output=True, text=True, timeout=10, check=True,
            ).stdout.strip()  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            commit = ""
        if commit:
            out["asyncq-git"] = commit
        return out

    @asynccontextmanager
    async def producer(self, cfg: Config) -> AsyncIterator[Producer]:
        async with Client(_url(cfg)) as client:
            yield AsyncqProducer(client)

    async def serve(self, cfg: Config, on_task: Callable[[int], None], stop: asyncio.Event) -> None:
        mux = ServeMux()

        @mux.handler("noop")
        async def noop(task: Task) -> None:
            on_task(int(task.payload or b"-1"))

        # metrics_history is passed only to turn it off, so that every revision runs with
        # its own default: one from before the option (`python -m benchmarks.ab` runs older
        # revisions) has no such argument.
        options: dict[str, Any] = {"metrics_history": False} if cfg.variant == "no-history" else {}
        server = Server(_url(cfg), concurrency=cfg.concurrency, queues={QUEUE: 1}, **options)
        async with server:
            await server.start(mux)
            await stop.wait()
            await server.shutdown()


if __name__ == "__main__":
    # same logging policy as the peers' scripts: warnings and errors only
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    main(Asyncq())
