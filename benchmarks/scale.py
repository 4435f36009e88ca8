"""Scale curves of asyncq alone: backlog, queues, payloads, workers, cluster, idle cost.

``python -m benchmarks.scale`` (part of ``nox -s bench``) starts its own throwaway
``redis-server`` (and, for the cluster phase, a three-master Redis Cluster) on free
ports and runs six phases, each a small table of rows:

1. ``backlog``  -- enqueue a backlog of 1,000,000 tasks with ``Client.enqueue_many``
   (batches of 5,000): enqueue rate and Redis memory per slice of 100,000, then one
   worker process (concurrency 100, no-op handler) drains it: rate per slice.
2. ``queues``   -- 1, 10, 100, 1,000 queues served by one worker, weighted and
   strict order: tasks/s, Redis CPU and commands per task.
3. ``payload``  -- 100 B, 10 KB and 1 MB payloads: enqueue and processing tasks/s, MB/s.
4. ``workers``  -- 1, 2, 4, 8 worker processes draining one backlog on one Redis:
   total tasks/s, Redis CPU per task and redis-server CPU as % of one core.
5. ``cluster``  -- the same queues (spread over the slots) on one Redis and on a
   three-master Redis Cluster: enqueue and processing tasks/s.
6. ``idle``     -- (a) an idle server with 1 and 10 queues: commands per second it
   sends (MONITOR: client commands vs. commands run inside scripts) and
   ``INFO commandstats``; (b) pickup latency of tasks written the way Go asynq's
   client writes them (one script: HSET + LPUSH, no wake-up PUBLISH); (c) pickup
   latency of asyncq's own ``Client.enqueue`` (which publishes a wake-up).

Workers are separate processes (``--role worker``, driven over stdin/stdout); each
reports ``getrusage`` CPU, so worker CPU µs per task is its own. Redis CPU is
``INFO cpu`` (sys + user) summed over the nodes. The driver writes the rows as JSON
(``benchmarks/results/scale-<date>.json``), a markdown report (stdout and
``--markdown``) and, unless ``--no-plots``, small PNGs (``docs/images/bench-scale-*``,
needs matplotlib). ``--quick`` shrinks every size (a smoke run of well under a
minute); ``--phases`` selects phases.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.systems._common import Resp, percentile

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
IMAGES = ROOT / "docs" / "images"
PHASES = ("backlog", "queues", "payload", "workers", "cluster", "idle")
OWN_COMMANDS = {"info", "config|resetstat", "config", "monitor", "flushall", "cluster|info"}

# Go asynq v0.26's enqueueCmd: the task hash and the pending list, no PUBLISH.
GO_ENQUEUE = """
if redis.call("EXISTS", KEYS[1]) == 1 then
    return 0
end
redis.call("HSET", KEYS[1], "msg", ARGV[1], "state", "pending", "pending_since", ARGV[3])
redis.call("LPUSH", KEYS[2], ARGV[2])
return 1
"""


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _quiet() -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.basicConfig(level=logging.WARNING)


# --------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    backlog: int = 1_000_000
    backlog_slices: int = 10
    batch: int = 5_000
    queues_n: int = 100_000
    queue_counts: tuple[int, ...] = (1, 10, 100, 1000)
    payloads: tuple[tuple[int, int], ...] = ((100, 100_000), (10_000, 20_000), (1_000_000, 500))
    workers_n: int = 200_000
    worker_counts: tuple[int, ...] = (1, 2, 4, 8)
    cluster_n: int = 100_000
    cluster_queues: int = 12
    cluster_workers: tuple[int, ...] = (1, 2)
    idle_settle: float = 2.0
    idle_window: float = 10.0
    idle_queue_counts: tuple[int, ...] = (1, 10)
    pickup_samples: int = 200
    pickup_interval: float = 0.05
    settled_samples: int = 40
    concurrency: int = 100
    cap: float = 900.0
    repeat: int = 1

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            backlog=5_000,
            backlog_slices=5,
            batch=1_000,
            queues_n=1_000,
            queue_counts=(1, 100),
            payloads=((100, 500), (10_000, 300), (1_000_000, 10)),
            workers_n=1_000,
            worker_counts=(1, 2),
            cluster_n=1_000,
            cluster_queues=6,
            cluster_workers=(1,),
            idle_settle=0.5,
            idle_window=1.0,
            idle_queue_counts=(1, 10),
            pickup_samples=20,
            settled_samples=3,
            cap=60.0,
        )


# --------------------------------------------------------------------------- redis


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProcs:
    """Throwaway redis-server processes: one standalone server or a cluster of masters."""

    def __init__(self, *, cluster: int = 0) -> None:
        self.cluster = cluster
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dirs: list[str] = []

    @property
    def url(self) -> str:
        if self.cluster:
            return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> RedisProcs:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not on PATH (apt-get install redis-server)")
        try:
            for _ in range(self.cluster or 1):
                port = _free_port()
                workdir = tempfile.mkdtemp(prefix=f"asyncq-bench-scale-{port}-")
                args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", workdir,
                        "--loglevel", "warning"]  # fmt: skip
                if self.cluster:
                    args += ["--cluster-enabled", "yes", "--cluster-port", str(_free_port()),
                             "--cluster-config-file", f"{workdir}/nodes.conf",
                             "--cluster-node-timeout", "5000"]  # fmt: skip
                self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))
                self.ports.append(port)
                self.dirs.append(workdir)
            for port in self.ports:
                self._wait(lambda port=port: self.resp(port).call("PING") == b"PONG")
            if self.cluster:
                addrs = [f"127.0.0.1:{p}" for p in self.ports]
                subprocess.run(
                    ["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", "0",
                     "--cluster-yes"],
                    capture_output=True, timeout=60, check=True,
                )  # fmt: skip
                for port in self.ports:
                    self._wait(
                        lambda port=port: (
                            b"cluster_state:ok" in self.resp(port).call("CLUSTER", "INFO")
                        )
                    )
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def resp(port: int) -> Resp:
        return Resp(f"redis://127.0.0.1:{port}/0", timeout=60)

    @staticmethod
    def _wait(predicate: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                if predicate():
                    return
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not become ready")
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.procs.clear()


class Nodes:
    """Stats over every node of a setup (one connection each)."""

    def __init__(self, ports: Sequence[int]) -> None:
        self.conns = [RedisProcs.resp(p) for p in ports]

    def close(self) -> None:
        for c in self.conns:
            c.close()

    def flush(self) -> None:
        for c in self.conns:
            c.call("FLUSHALL")

    def reset(self) -> None:
        for c in self.conns:
            c.call("CONFIG", "RESETSTAT")

    def cpu(self) -> float:
        return sum(c.cpu_seconds() for c in self.conns)

    def memory(self) -> int:
        return sum(c.used_memory() for c in self.conns)

    def commands(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.conns:
            for key, value in c.info("commandstats").items():
                name = key.removeprefix("cmdstat_")
                if name in OWN_COMMANDS:
                    continue
                fields = dict(f.split("=", 1) for f in value.split(","))
                out[name] = out.get(name, 0) + int(fields["calls"])
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


@contextlib.contextmanager
def redis_setup(*, cluster: int = 0) -> Iterator[tuple[RedisProcs, Nodes]]:
    procs = RedisProcs(cluster=cluster).start()
    nodes = Nodes(procs.ports)
    try:
        yield procs, nodes
    finally:
        nodes.close()
        procs.stop()


class Monitor:
    """Counts the commands Redis runs, from MONITOR, split into client-sent and in-script."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), 10)
        self.sock.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        self.reader = self.sock.makefile("rb")
        if self.reader.readline().strip() != b"+OK":
            raise RuntimeError("MONITOR was refused")
        self.window = (math.inf, math.inf)  # count commands Redis stamped inside it
        self.sent: dict[str, int] = {}
        self.in_scripts: dict[str, int] = {}
        # Set once a command Redis stamped after the window is read: every command
        # inside the window has then been counted (MONITOR streams in order).
        self.past_window = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in self.reader:
                # +1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "..."  (script: [0 lua])
                line = raw.decode(errors="replace")
                try:
                    stamp = float(line[1 : line.index(" ")])
                except ValueError:
                    continue
                if stamp > self.window[1]:
                    self.past_window.set()
                if not self.window[0] <= stamp <= self.window[1]:
                    continue
                _, _, rest = line.partition("] ")
                source = line[line.find("[") : line.find("]")]
                name = rest.split('"', 2)[1].lower() if rest.count('"') >= 2 else "?"
                bucket = self.in_scripts if "lua" in source else self.sent
                bucket[name] = bucket.get(name, 0) + 1

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


# --------------------------------------------------------------------------- worker role


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def worker_main(cfg: dict[str, Any]) -> None:
    """One asyncq Server process; commands on stdin: go, cpu, stop."""
    _quiet()
    from asyncq import ServeMux, Server, Task

    loop = asyncio.get_running_loop()

    async def command() -> str:
        return (await loop.run_in_executor(None, sys.stdin.readline)).strip()

    emit({"event": "ready"})
    if await command() != "go":
        return
    cpu0 = cpu_seconds()
    done = 0
    last_t = 0.0
    slice_every = int(cfg.get("slice") or 0)

    async def noop(task: Task) -> None:
        nonlocal done, last_t
        t = time.time()
        done += 1
        last_t = t
        tid = task.id or ""
        if tid.startswith("lat-"):
            emit({"event": "pick", "id": tid, "t": t})
        if slice_every and done % slice_every == 0:
            emit({"event": "slice", "done": done, "t": t})

    mux = ServeMux()
    mux.handle("noop", noop)
    server = Server(
        cfg["url"],
        concurrency=cfg["concurrency"],
        queues=cfg["queues"],
        strict_priority=cfg["strict"],
    )

    async def progress() -> None:
        seen = -1
        while True:
            await asyncio.sleep(0.05)
            if done != seen:
                seen = done
                emit({"event": "progress", "done": done, "t": last_t})

    async with server:
        await server.start(mux)
        reporter = asyncio.create_task(progress())
        while (cmd := await command()) not in ("stop", ""):
            if cmd == "cpu":
                emit({"event": "cpu", "cpu_s": cpu_seconds() - cpu0, "done": done})
        cpu_end = cpu_seconds() - cpu0
        reporter.cancel()
        await server.shutdown()
    emit({"event": "result", "done": done, "last_t": last_t, "cpu_s": cpu_end})


class Worker:
    """Driver side of one worker process."""

    def __init__(
        self, url: str, queues: dict[str, int], *, strict: bool = False, concurrency: int = 100,
        slice_every: int = 0,
    ) -> None:  # fmt: skip
        self.cfg = {"url": url, "queues": queues, "strict": strict,
                    "concurrency": concurrency, "slice": slice_every}  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None
        self.done = 0
        self.slices: list[tuple[int, float]] = []
        self.picks: dict[str, float] = {}
        self.pick_waiters: dict[str, asyncio.Event] = {}
        self.ready = asyncio.Event()
        self.cpu_reply: asyncio.Queue[float] = asyncio.Queue()
        self.result: asyncio.Future[dict[str, Any]] | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.scale", "--role", "worker",
            "--config", json.dumps(self.cfg),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
        )  # fmt: skip
        self.result = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read())
        await asyncio.wait_for(self.ready.wait(), 60)

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None and self.result
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("{"):
                if line:
                    print(f"[worker] {line}", file=sys.stderr)
                continue
            rec = json.loads(line)
            ev = rec["event"]
            if ev == "ready":
                self.ready.set()
            elif ev == "progress":
                self.done = max(self.done, rec["done"])
            elif ev == "slice":
                self.slices.append((rec["done"], rec["t"]))
            elif ev == "pick":
                self.picks[rec["id"]] = rec["t"]
                if (waiter := self.pick_waiters.get(rec["id"])) is not None:
                    waiter.set()
            elif ev == "cpu":
                self.cpu_reply.put_nowait(rec["cpu_s"])
            elif ev == "result" and not self.result.done():
                self.done = rec["done"]
                self.result.set_result(rec)
        rc = await self.proc.wait()
        if not self.result.done():
            self.result.set_exception(RuntimeError(f"worker exited with code {rc}"))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def send(self, cmd: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(cmd.encode() + b"\n")
        await self.proc.stdin.drain()

    async def cpu(self) -> float:
        await self.send("cpu")
        return await asyncio.wait_for(self.cpu_reply.get(), 30)

    async def stop(self) -> dict[str, Any]:
        assert self.result is not None and self.proc is not None
        if self.alive():
            with contextlib.suppress(ConnectionError):
                await self.send("stop")
        try:
            rec = await asyncio.wait_for(asyncio.shield(self.result), 60)
            await asyncio.wait_for(self.proc.wait(), 30)
        except BaseException:
            self.kill()
            raise
        return rec

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()


@contextlib.asynccontextmanager
async def workers(
    n: int, url: str, queues: dict[str, int], **kw: Any
) -> AsyncIterator[list[Worker]]:
    ws = [Worker(url, queues, **kw) for _ in range(n)]
    try:
        await asyncio.gather(*(w.start() for w in ws))
        yield ws
    finally:
        for w in ws:
            w.kill()


# --------------------------------------------------------------------------- building blocks


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


async def enqueue_spread(
    url: str, queues: Sequence[str], n: int, *, payload: bytes = b"", batch: int = 5_000,
    width: int = 1,
) -> float:  # fmt: skip
    """Enqueue *n* no-op tasks spread evenly over *queues*; returns the seconds it took.

    *width* queues are filled concurrently (one ``enqueue_many`` per batch each)."""
    from asyncq import Client, Task

    async with Client(url) as client:
        counts = dict(zip(queues, _split(n, len(queues)), strict=True))
        todo = iter(counts.items())

        async def lane() -> None:
            for q, count in todo:
                i = 0
                while i < count:
                    size = min(batch, count - i)
                    tasks = [Task("noop", payload or b"%d" % (i + k)) for k in range(size)]
                    for res in await client.enqueue_many(tasks, queue=q):
                        if isinstance(res, Exception):
                            raise res
                    i += size

        t0 = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(max(1, width))))
        return time.perf_counter() - t0


async def drain(
    nodes: Nodes, url: str, queues: dict[str, int], n: int, *, n_workers: int = 1,
    strict: bool = False, slice_every: int = 0, concurrency: int = 100, cap: float = 900.0,
) -> dict[str, Any]:  # fmt: skip
    """Start *n_workers* worker processes on a backlog of *n* tasks; time until all ran."""
    async with workers(
        n_workers, url, queues, strict=strict, concurrency=concurrency, slice_every=slice_every
    ) as ws:
        nodes.reset()
        rcpu0 = nodes.cpu()
        t0 = time.time()
        for w in ws:
            await w.send("go")
        capped = False
        while sum(w.done for w in ws) < n:
            if not all(w.alive() for w in ws):
                raise RuntimeError("a worker process died")
            if time.time() - t0 > cap:
                capped = True
                break
            await asyncio.sleep(0.02)
        rcpu = nodes.cpu() - rcpu0
        wall = time.time() - t0
        commands = nodes.commands()
        results = [await w.stop() for w in ws]
    done = sum(r["done"] for r in results)
    end = max(r["last_t"] for r in results) if not capped else t0 + wall
    seconds = max(end - t0, 1e-9)
    out: dict[str, Any] = {
        "n": n,
        "workers": n_workers,
        "processed": done,
        "seconds": round(seconds, 3),
        "tasks_per_s": round(done / seconds, 1),
        "worker_cpu_us_per_task": round(sum(r["cpu_s"] for r in results) * 1e6 / max(done, 1), 1),
        "redis_cpu_us_per_task": round(rcpu * 1e6 / max(done, 1), 2),
        "redis_cpu_pct_of_core": round(rcpu * 100 / wall, 1),
        "redis_cmds_per_task": round(sum(commands.values()) / max(done, 1), 3),
        "capped": capped,
    }
    if slice_every and ws:
        out["slices"] = [(k, t - t0) for k, t in sorted(ws[0].slices)]
    return out


async def _repeated(sz: Sizes, one: Any) -> dict[str, Any]:
    """``await one()`` ``sz.repeat`` times; each number the median of the runs (the machine
    is shared: one slow run should not make the curve)."""
    runs: list[dict[str, Any]] = [await one() for _ in range(sz.repeat)]
    out = dict(runs[0])
    if len(runs) == 1:
        return out
    for key, value in runs[0].items():
        values = [r[key] for r in runs]
        if isinstance(value, int | float) and not isinstance(value, bool) and len(set(values)) > 1:
            out[key] = round(statistics.median(values), 2)
    speed = "tasks_per_s" if "tasks_per_s" in out else "process_tasks_per_s"
    out["repeats"] = len(runs)
    out["runs_" + speed] = [r[speed] for r in runs]
    return out


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# --------------------------------------------------------------------------- phases


async def phase_backlog(sz: Sizes) -> dict[str, Any]:
    from asyncq import Client, Task

    n, slices = sz.backlog, sz.backlog_slices
    per_slice = n // slices
    rows: list[dict[str, Any]] = []
    with redis_setup() as (procs, nodes):
        url = procs.url
        mem0 = nodes.memory()
        rcpu0 = nodes.cpu()
        ccpu0 = cpu_seconds()
        t_all = time.perf_counter()
        async with Client(url) as client:
            i = 0
            for s in range(slices):
                t0 = time.perf_counter()
                end = (s + 1) * per_slice if s < slices - 1 else n
                while i < end:
                    size = min(sz.batch, end - i)
                    tasks = [Task("noop", b"%d" % (i + k)) for k in range(size)]
                    for res in await client.enqueue_many(tasks, queue="default"):
                        if isinstance(res, Exception):
                            raise res
                    i += size
                secs = time.perf_counter() - t0
                rows.append(
                    {
                        "slice": s + 1,
                        "upto": end,
                        "enqueue_tasks_per_s": round((end - s * per_slice) / secs, 1),
                        "memory_bytes_per_task": round((nodes.memory() - mem0) / end, 1),
                    }
                )
        enqueue_seconds = time.perf_counter() - t_all
        enqueue = {
            "n": n,
            "batch": sz.batch,
            "seconds": round(enqueue_seconds, 2),
            "tasks_per_s": round(n / enqueue_seconds, 1),
            "client_cpu_us_per_task": round((cpu_seconds() - ccpu0) * 1e6 / n, 1),
            "redis_cpu_us_per_task": round((nodes.cpu() - rcpu0) * 1e6 / n, 2),
            "memory_bytes_per_task": round((nodes.memory() - mem0) / n, 1),
            "used_memory_mb": round(nodes.memory() / 1e6, 1),
        }
        # Where the bytes go: MEMORY USAGE of sampled task hashes and of the pending list.
        conn = nodes.conns[0]
        ids = conn.call("LRANGE", "asynq:{default}:pending", 0, 99)
        sizes = [conn.call("MEMORY", "USAGE", b"asynq:{default}:t:" + i) for i in ids]
        enqueue["task_hash_bytes"] = round(sum(sizes) / max(len(sizes), 1), 1)
        pending = conn.call("MEMORY", "USAGE", "asynq:{default}:pending", "SAMPLES", 0)
        enqueue["pending_list_bytes_per_task"] = round(pending / n, 1)
        log(f"backlog: {n} enqueued at {enqueue['tasks_per_s']}/s, "
            f"{enqueue['memory_bytes_per_task']} B/task; draining")  # fmt: skip
        res = await drain(
            nodes, url, {"default": 1}, n, slice_every=per_slice, concurrency=sz.concurrency,
            cap=sz.cap * 4,
        )  # fmt: skip
        prev_k, prev_t = 0, 0.0
        for row, (k, t) in zip(rows, res.pop("slices"), strict=False):
            row["process_tasks_per_s"] = round((k - prev_k) / max(t - prev_t, 1e-9), 1)
            prev_k, prev_t = k, t
        res["memory_after_drain_bytes"] = nodes.memory() - mem0
    return {"enqueue": enqueue, "process": res, "rows": rows, "loadavg": _loadavg()}


async def phase_queues(sz: Sizes) -> dict[str, Any]:
    rows = []
    with redis_setup() as (procs, nodes):
        for nq in sz.queue_counts:
            names = [f"bq{i:05d}" for i in range(nq)]
            for mode in ("weighted", "strict"):

                async def one(names: list[str] = names, mode: str = mode) -> dict[str, Any]:
                    nodes.flush()
                    await enqueue_spread(procs.url, names, sz.queues_n, batch=sz.batch, width=4)
                    queues = {q: 1 + i % 10 for i, q in enumerate(names)}
                    return await drain(nodes, procs.url, queues, sz.queues_n,
                                       strict=mode == "strict", concurrency=sz.concurrency,
                                       cap=sz.cap)  # fmt: skip

                row = {"queues": nq, "mode": mode, **await _repeated(sz, one)}
                log(f"queues: {nq} {mode}: {row['tasks_per_s']}/s, "
                    f"Redis {row['redis_cpu_us_per_task']} µs/task")  # fmt: skip
                rows.append(row)
    return {"rows": rows, "loadavg": _loadavg()}


async def phase_payload(sz: Sizes) -> dict[str, Any]:
    rows = []
    with redis_setup() as (procs, nodes):
        for size, n in sz.payloads:

            async def one(size: int = size, n: int = n) -> dict[str, Any]:
                nodes.flush()
                payload = b"x" * size
                batch = max(1, min(sz.batch, 16_000_000 // size))
                rcpu0 = nodes.cpu()
                secs = await enqueue_spread(procs.url, ["default"], n, payload=payload,
                                            batch=batch)  # fmt: skip
                enq_redis = nodes.cpu() - rcpu0
                res = await drain(nodes, procs.url, {"default": 1}, n,
                                  concurrency=sz.concurrency, cap=sz.cap)  # fmt: skip
                return {
                    "payload_bytes": size, "n": n, "batch": batch,
                    "enqueue_tasks_per_s": round(n / secs, 1),
                    "enqueue_mb_per_s": round(size * n / 1e6 / secs, 1),
                    "enqueue_redis_cpu_us_per_task": round(enq_redis * 1e6 / n, 1),
                    "process_tasks_per_s": res["tasks_per_s"],
                    "process_mb_per_s": round(res["tasks_per_s"] * size / 1e6, 1),
                    "worker_cpu_us_per_task": res["worker_cpu_us_per_task"],
                    "redis_cpu_us_per_task": res["redis_cpu_us_per_task"],
                }  # fmt: skip

            row = await _repeated(sz, one)
            log(f"payload {size} B: enqueue {row['enqueue_tasks_per_s']}/s, "
                f"process {row['process_tasks_per_s']}/s")  # fmt: skip
            rows.append(row)
    return {"rows": rows, "loadavg": _loadavg()}


async def phase_workers(sz: Sizes) -> dict[str, Any]:
    rows = []
    names = [f"wq{i}" for i in range(4)]
    with redis_setup() as (procs, nodes):
        for k in sz.worker_counts:

            async def one(k: int = k) -> dict[str, Any]:
                nodes.flush()
                await enqueue_spread(procs.url, names, sz.workers_n, batch=sz.batch, width=4)
                return await drain(nodes, procs.url, dict.fromkeys(names, 1), sz.workers_n,
                                   n_workers=k, concurrency=sz.concurrency,
                                   cap=sz.cap)  # fmt: skip

            res = await _repeated(sz, one)
            log(f"workers: {k}: {res['tasks_per_s']}/s, redis-server "
                f"{res['redis_cpu_pct_of_core']} % of a core")  # fmt: skip
            rows.append(res)
    saturated = [r["workers"] for r in rows if r["redis_cpu_pct_of_core"] >= 90]
    return {
        "rows": rows,
        "redis_saturated_at_workers": saturated[0] if saturated else None,
        "cpus": os.cpu_count(),
        "loadavg": _loadavg(),
    }


def _cluster_queue_names(nodes: Nodes, ports: Sequence[int], count: int) -> list[str]:
    """Queue names whose hash slots are spread evenly over the masters."""
    slots = nodes.conns[0].call("CLUSTER", "SLOTS")
    owner = [(int(r[0]), int(r[1]), int(r[2][1])) for r in slots]
    per_master = {p: [] for p in ports}  # type: dict[int, list[str]]
    i = 0
    want = -(-count // len(ports))
    while sum(len(v) for v in per_master.values()) < count:
        name = f"cq{i}"
        i += 1
        slot = int(nodes.conns[0].call("CLUSTER", "KEYSLOT", f"asynq:{{{name}}}:pending"))
        port = next(p for lo, hi, p in owner if lo <= slot <= hi)
        if len(per_master[port]) < want:
            per_master[port].append(name)
    return [q for qs in per_master.values() for q in qs][:count]


async def phase_cluster(sz: Sizes) -> dict[str, Any]:
    rows = []
    queue_names: list[str] = []
    with redis_setup(cluster=3) as (procs, nodes):
        queue_names = _cluster_queue_names(nodes, procs.ports, sz.cluster_queues)
        rows += await _cluster_rows("cluster (3 masters)", procs, nodes, queue_names, sz)
    with redis_setup() as (procs, nodes):
        rows = await _cluster_rows("one Redis", procs, nodes, queue_names, sz) + rows
    return {"rows": rows, "queues": queue_names, "loadavg": _loadavg()}


async def _cluster_rows(
    label: str, procs: RedisProcs, nodes: Nodes, names: list[str], sz: Sizes
) -> list[dict[str, Any]]:
    rows = []
    for k in sz.cluster_workers:

        async def one(k: int = k) -> dict[str, Any]:
            nodes.flush()
            rcpu0 = nodes.cpu()
            secs = await enqueue_spread(procs.url, names, sz.cluster_n, batch=1_000,
                                        width=len(names))  # fmt: skip
            enq_redis = nodes.cpu() - rcpu0
            res = await drain(nodes, procs.url, dict.fromkeys(names, 1), sz.cluster_n,
                              n_workers=k, concurrency=sz.concurrency, cap=sz.cap)  # fmt: skip
            return {"setup": label, "workers": k, "n": sz.cluster_n,
                    "enqueue_tasks_per_s": round(sz.cluster_n / secs, 1),
                    "enqueue_redis_cpu_us_per_task": round(enq_redis * 1e6 / sz.cluster_n, 1),
                    "process_tasks_per_s": res["tasks_per_s"],
                    "process_redis_cpu_us_per_task": res["redis_cpu_us_per_task"],
                    "worker_cpu_us_per_task": res["worker_cpu_us_per_task"]}  # fmt: skip

        row = await _repeated(sz, one)
        log(f"cluster: {label}, {k} worker(s): enqueue {row['enqueue_tasks_per_s']}/s, "
            f"process {row['process_tasks_per_s']}/s")  # fmt: skip
        rows.append(row)
    return rows


def _pickup_stats(lat_ms: list[float], expected: int) -> dict[str, Any]:
    lat_ms.sort()
    return {
        "samples": len(lat_ms),
        "lost": expected - len(lat_ms),
        "p50_ms": round(percentile(lat_ms, 50), 3),
        "p90_ms": round(percentile(lat_ms, 90), 3),
        "p99_ms": round(percentile(lat_ms, 99), 3),
        "max_ms": round(lat_ms[-1], 3) if lat_ms else math.nan,
        "latencies_ms": [round(x, 3) for x in lat_ms],
    }


async def _pickups(w: Worker, send: Any, samples: int, gap: Any, prefix: str) -> dict[str, Any]:
    """*samples* tasks sent one at a time by ``send(tid)``; the next send follows ``gap()``
    seconds after the previous one (a fixed cadence, independent of the pickups)."""
    lat: list[float] = []
    after: list[float] = []
    tick = time.perf_counter()
    for k in range(samples):
        tid = f"lat-{prefix}-{k}"
        arrived = w.pick_waiters[tid] = asyncio.Event()
        before = time.time()
        await send(tid)
        returned = time.time()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arrived.wait(), 5)
        if tid in w.picks:
            lat.append((w.picks[tid] - before) * 1000)
            after.append((w.picks[tid] - returned) * 1000)
        tick += gap()
        await asyncio.sleep(max(0.0, tick - time.perf_counter()))
    out = _pickup_stats(lat, samples)
    # The worker's share: from the moment the write returned to the handler's start.
    after.sort()
    out["p50_ms_after_write_returned"] = round(percentile(after, 50), 3)
    out["p99_ms_after_write_returned"] = round(percentile(after, 99), 3)
    return out


async def phase_idle(sz: Sizes) -> dict[str, Any]:
    from asyncq import Client, Task
    from asyncq.proto.asynq import TaskMessage

    idle_rows = []
    pickup_rows = []
    with redis_setup() as (procs, nodes):
        port = procs.ports[0]
        for nq in sz.idle_queue_counts:
            nodes.flush()
            names = ["default"] if nq == 1 else [f"iq{i}" for i in range(nq)]
            async with workers(1, procs.url, dict.fromkeys(names, 1)) as (w,):
                await w.send("go")
                await asyncio.sleep(sz.idle_settle)  # startup writes done, polling at its slowest
                mon = Monitor(port)
                nodes.reset()
                rcpu0 = nodes.cpu()
                wcpu0 = await w.cpu()
                t0 = time.time()
                mon.window = (t0, t0 + sz.idle_window)
                await asyncio.sleep(sz.idle_window)
                window = time.time() - t0
                wcpu = await w.cpu() - wcpu0
                rcpu = nodes.cpu() - rcpu0
                stats = nodes.commands()  # INFO: a command stamped after the window
                # the MONITOR reader has caught up once it has read that INFO
                if not await asyncio.to_thread(mon.past_window.wait, 30):
                    raise RuntimeError("MONITOR did not stream past the idle window")
                mon.close()
                sent = sum(mon.sent.values())
                inner = sum(mon.in_scripts.values())
                row = {
                    "queues": nq,
                    "window_s": round(window, 2),
                    "commands_sent_per_s": round(sent / window, 1),
                    "commands_in_scripts_per_s": round(inner / window, 1),
                    "commandstats_calls_per_s": round(sum(stats.values()) / window, 1),
                    "sent_by_command": mon.sent,
                    "in_scripts_by_command": mon.in_scripts,
                    "commandstats": stats,
                    "redis_cpu_pct": round(rcpu * 100 / window, 3),
                    "worker_cpu_pct": round(wcpu * 100 / window, 3),
                }
                log(f"idle: {nq} queue(s): {row['commands_sent_per_s']} commands sent/s, "
                    f"{row['commandstats_calls_per_s']} commandstats calls/s")  # fmt: skip
                idle_rows.append(row)

                if nq != 1:
                    await w.stop()
                    continue
                # (b) tasks written as Go asynq's client writes them: no wake-up message
                sha = nodes.conns[0].call("SCRIPT", "LOAD", GO_ENQUEUE)
                nodes.conns[0].call("SADD", "asynq:queues", "default")

                async def go_style(tid: str, sha: bytes = sha) -> None:
                    msg = TaskMessage(type="noop", payload=b"0", id=tid, queue="default",
                                      retry=25, timeout=1800)  # fmt: skip
                    nodes.conns[0].call(
                        "EVALSHA", sha, 2, f"asynq:{{default}}:t:{tid}",
                        "asynq:{default}:pending", bytes(msg), tid, time.time_ns(),
                    )  # fmt: skip

                for label, samples, gap in (
                    (f"fixed {sz.pickup_interval * 1000:.0f} ms cadence", sz.pickup_samples,
                     lambda: sz.pickup_interval),
                    ("settled idle (random 0.3-0.7 s gaps)", sz.settled_samples,
                     lambda: random.uniform(0.3, 0.7)),
                ):  # fmt: skip
                    res = await _pickups(w, go_style, samples, gap, f"go{len(pickup_rows)}")
                    pickup_rows.append({"producer": "Go-style script (no wake-up)",
                                        "spacing": label, **res})  # fmt: skip
                    log(f"pickup, no wake-up, {label}: p50 {res['p50_ms']} ms, "
                        f"p99 {res['p99_ms']} ms")  # fmt: skip

                # (c) asyncq's own enqueue, which publishes a wake-up
                async with Client(procs.url) as client:
                    # warm the connection and the script cache; the samples start once
                    # the worker has run these (it reports the "lat-" ids it picks)
                    warm = [f"lat-warm-{k}" for k in range(5)]
                    for tid in warm:
                        w.pick_waiters[tid] = asyncio.Event()
                        await client.enqueue(Task("noop", b"w"), queue="default", task_id=tid)
                    for tid in warm:
                        await asyncio.wait_for(w.pick_waiters[tid].wait(), 30)

                    async def asyncq_style(tid: str) -> None:
                        await client.enqueue(Task("noop", b"0"), queue="default", task_id=tid)

                    res = await _pickups(w, asyncq_style, sz.pickup_samples,
                                         lambda: sz.pickup_interval, "aq")  # fmt: skip
                pickup_rows.append({"producer": "asyncq Client.enqueue (wake-up)",
                                    "spacing": f"fixed {sz.pickup_interval * 1000:.0f} ms cadence",
                                    **res})  # fmt: skip
                log(f"pickup, asyncq enqueue: p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms")
                await w.stop()
    return {"idle": idle_rows, "pickup": pickup_rows, "loadavg": _loadavg()}


PHASE_FUNCS = {
    "backlog": phase_backlog,
    "queues": phase_queues,
    "payload": phase_payload,
    "workers": phase_workers,
    "cluster": phase_cluster,
    "idle": phase_idle,
}


# --------------------------------------------------------------------------- report


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "–" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.3g}" if abs(v) < 1 else f"{v:.1f}"
    return str(v)


def _table(rows: Sequence[dict[str, Any]], cols: Sequence[tuple[str, str]]) -> str:
    out = ["| " + " | ".join(h for _, h in cols) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(cols))) + "|"]  # fmt: skip
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(k)) for k, _ in cols) + " |")
    return "\n".join(out)


def render(doc: dict[str, Any]) -> str:
    p = doc["phases"]
    m = doc["machine"]
    parts = [
        f"## asyncq scale benchmark, {doc['started'][:16].replace('T', ' ')} UTC",
        "",
        f"{m.get('cpus')} CPUs ({m.get('cpu_model', '?')}), Python {m['python']}, "
        f"redis-server {m.get('redis_version', '?')}, uvloop: {m.get('uvloop')}; "
        f"mode: {'quick' if doc['quick'] else 'full'}; load average at start "
        f"{m.get('loadavg_start')}. One worker process = one `Server(concurrency=100)`, "
        "no-op handler; the driver, the workers and Redis share the machine.",
    ]
    if "backlog" in p:
        b = p["backlog"]
        e, pr = b["enqueue"], b["process"]
        parts += [
            "", f"### Backlog of {e['n']:,} tasks",
            "",
            f"Enqueue (`enqueue_many`, batches of {e['batch']:,}): {_fmt(e['tasks_per_s'])} "
            f"tasks/s overall, Redis memory {_fmt(e['memory_bytes_per_task'])} B/task "
            f"({_fmt(e['used_memory_mb'])} MB used; `MEMORY USAGE` of a task hash "
            f"{_fmt(e['task_hash_bytes'])} B, of the pending list "
            f"{_fmt(e['pending_list_bytes_per_task'])} B per task; the rest is the keyspace "
            "dictionary), client CPU "
            f"{_fmt(e['client_cpu_us_per_task'])} µs/task, Redis CPU "
            f"{_fmt(e['redis_cpu_us_per_task'])} µs/task. Drain (one worker): "
            f"{_fmt(pr['tasks_per_s'])} tasks/s overall, worker CPU "
            f"{_fmt(pr['worker_cpu_us_per_task'])} µs/task, Redis CPU "
            f"{_fmt(pr['redis_cpu_us_per_task'])} µs/task, "
            f"{_fmt(pr['redis_cmds_per_task'])} commands/task.",
            "",
            _table(b["rows"], [("upto", "tasks enqueued (slice end)"),
                               ("enqueue_tasks_per_s", "enqueue tasks/s (slice)"),
                               ("memory_bytes_per_task", "Redis B/task so far"),
                               ("process_tasks_per_s", "process tasks/s (slice)")]),
        ]  # fmt: skip
    if "queues" in p:
        parts += ["", "### Queues served by one worker", "", _table(p["queues"]["rows"], [
            ("queues", "queues"), ("mode", "order"), ("tasks_per_s", "tasks/s"),
            ("redis_cpu_us_per_task", "Redis CPU µs/task"),
            ("redis_cmds_per_task", "Redis cmds/task"),
            ("worker_cpu_us_per_task", "worker CPU µs/task")])]  # fmt: skip
    if "payload" in p:
        parts += ["", "### Payload size", "", _table(p["payload"]["rows"], [
            ("payload_bytes", "payload B"), ("n", "tasks"),
            ("enqueue_tasks_per_s", "enqueue tasks/s"), ("enqueue_mb_per_s", "enqueue MB/s"),
            ("process_tasks_per_s", "process tasks/s"), ("process_mb_per_s", "process MB/s"),
            ("worker_cpu_us_per_task", "worker CPU µs/task"),
            ("redis_cpu_us_per_task", "Redis CPU µs/task (process)")])]  # fmt: skip
    if "workers" in p:
        w = p["workers"]
        sat = w["redis_saturated_at_workers"]
        parts += ["", "### Worker processes on one Redis", "", _table(w["rows"], [
            ("workers", "workers"), ("tasks_per_s", "tasks/s"),
            ("redis_cpu_us_per_task", "Redis CPU µs/task"),
            ("redis_cpu_pct_of_core", "redis-server CPU % of a core"),
            ("worker_cpu_us_per_task", "worker CPU µs/task (all)")]), "",
            "redis-server reached ≥ 90 % of one core at: "
            + (f"{sat} workers." if sat
               else f"never (the {w['cpus']}-CPU machine ran out first).")]  # fmt: skip
    if "cluster" in p:
        parts += ["", f"### Redis Cluster (3 masters) vs one Redis, "
                  f"{len(p['cluster']['queues'])} queues spread over the slots", "",
                  _table(p["cluster"]["rows"], [
            ("setup", "setup"), ("workers", "workers"),
            ("enqueue_tasks_per_s", "enqueue tasks/s"),
            ("process_tasks_per_s", "process tasks/s"),
            ("process_redis_cpu_us_per_task", "Redis CPU µs/task (process, all nodes)"),
            ("worker_cpu_us_per_task", "worker CPU µs/task")])]  # fmt: skip
    if "idle" in p:
        i = p["idle"]
        parts += ["", "### Idle cost (default config, one server)", "", _table(i["idle"], [
            ("queues", "queues"), ("commands_sent_per_s", "commands sent/s"),
            ("commands_in_scripts_per_s", "commands in scripts/s"),
            ("commandstats_calls_per_s", "INFO commandstats calls/s"),
            ("redis_cpu_pct", "redis-server CPU %"), ("worker_cpu_pct", "worker CPU %")]),
            "", "### Pickup latency into an idle worker", "", _table(i["pickup"], [
            ("producer", "producer"), ("spacing", "spacing"), ("samples", "samples"),
            ("p50_ms", "p50 ms"), ("p90_ms", "p90 ms"), ("p99_ms", "p99 ms"),
            ("max_ms", "max ms"),
            ("p50_ms_after_write_returned", "p50 ms after the write returned"),
            ("p99_ms_after_write_returned", "p99 ms after the write returned")])]  # fmt: skip
        for row in i["idle"]:
            parts += ["", f"Idle, {row['queues']} queue(s), commands sent: "
                      + ", ".join(f"{k} {v}" for k, v in row["sent_by_command"].items())
                      + "; in scripts: "
                      + (", ".join(f"{k} {v}" for k, v in row["in_scripts_by_command"].items())
                         or "none")
                      + f" (over {row['window_s']} s)."]  # fmt: skip
    return "\n".join(parts) + "\n"


def plot(doc: dict[str, Any], outdir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    p = doc["phases"]

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        path = outdir / f"bench-scale-{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    if "backlog" in p:
        rows = p["backlog"]["rows"]
        x = [r["upto"] / 1000 for r in rows]
        fig, ax = plt.subplots(figsize=(5.5, 3.2))
        ax.plot(x, [r["enqueue_tasks_per_s"] for r in rows], "o-", label="enqueue")
        ax.plot(x, [r.get("process_tasks_per_s", 0) for r in rows], "s-", label="process")
        ax.set_ylim(bottom=0)  # linear from 0: flat should look flat
        ax.set_xlabel("slice end (thousand tasks)")
        ax.set_ylabel("tasks/s in the slice")
        ax.set_title(f"Backlog of {p['backlog']['enqueue']['n']:,} tasks")
        ax.legend()
        ax.grid(alpha=0.3)
        save(fig, "backlog")
    if "queues" in p:
        rows = p["queues"]["rows"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.5, 3.2))
        for mode, mark in (("weighted", "o-"), ("strict", "s--")):
            sel = [r for r in rows if r["mode"] == mode]
            xs = [r["queues"] for r in sel]
            a1.plot(xs, [r["tasks_per_s"] for r in sel], mark, label=mode)
            a2.plot(xs, [r["redis_cpu_us_per_task"] for r in sel], mark, label=mode)
        for a, t in ((a1, "tasks/s"), (a2, "Redis CPU µs/task")):
            a.set_xscale("log")
            a.set_xlabel("queues")
            a.set_title(t)
            a.set_ylim(bottom=0)
            a.grid(alpha=0.3)
        a1.legend()
        save(fig, "queues")
    if "payload" in p:
        rows = p["payload"]["rows"]
        labels = [_size_label(r["payload_bytes"]) for r in rows]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.5, 3.2))
        xs = range(len(rows))
        a1.bar(
            [i - 0.2 for i in xs], [r["enqueue_tasks_per_s"] for r in rows], 0.4, label="enqueue"
        )
        a1.bar(
            [i + 0.2 for i in xs], [r["process_tasks_per_s"] for r in rows], 0.4, label="process"
        )
        a2.bar([i - 0.2 for i in xs], [r["enqueue_mb_per_s"] for r in rows], 0.4, label="enqueue")
        a2.bar([i + 0.2 for i in xs], [r["process_mb_per_s"] for r in rows], 0.4, label="process")
        for a, t in ((a1, "tasks/s (log)"), (a2, "MB/s")):
            a.set_xticks(list(xs), labels)
            a.set_title(t)
            a.grid(alpha=0.3, axis="y")
        a1.set_yscale("log")
        a1.legend()
        save(fig, "payload")
    if "workers" in p:
        rows = p["workers"]["rows"]
        xs = [r["workers"] for r in rows]
        fig, a1 = plt.subplots(figsize=(5.5, 3.2))
        a1.plot(xs, [r["tasks_per_s"] for r in rows], "o-", color="C0", label="tasks/s")
        a1.set_xlabel("worker processes")
        a1.set_ylabel("tasks/s", color="C0")
        a1.set_ylim(bottom=0)
        a2 = a1.twinx()
        a2.plot(xs, [r["redis_cpu_pct_of_core"] for r in rows], "s--", color="C1")
        a2.set_ylabel("redis-server CPU % of a core", color="C1")
        a2.set_ylim(0, 110)
        a1.set_xticks(xs)
        a1.grid(alpha=0.3)
        save(fig, "workers")
    if "cluster" in p:
        rows = p["cluster"]["rows"]
        labels = [f"{r['setup'].split(' (')[0]}\n{r['workers']} worker(s)" for r in rows]
        xs = range(len(rows))
        fig, ax = plt.subplots(figsize=(6.5, 3.2))
        ax.bar(
            [i - 0.2 for i in xs], [r["enqueue_tasks_per_s"] for r in rows], 0.4, label="enqueue"
        )
        ax.bar(
            [i + 0.2 for i in xs], [r["process_tasks_per_s"] for r in rows], 0.4, label="process"
        )
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("tasks/s")
        ax.legend()
        ax.grid(alpha=0.3, axis="y")
        save(fig, "cluster")
    if "idle" in p:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for r in p["idle"]["pickup"]:
            lat = r["latencies_ms"]
            if lat:
                ys = [(k + 1) / len(lat) for k in range(len(lat))]
                ax.step(
                    lat, ys, where="post", label=f"{r['producer'].split(' (')[0]}, {r['spacing']}"
                )
        ax.set_xscale("log")
        ax.set_xlabel("pickup latency ms (log)")
        ax.set_ylabel("fraction of tasks")
        ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.02))
        ax.grid(alpha=0.3)
        save(fig, "pickup")
    return written


def _size_label(size: int) -> str:
    if size >= 1_000_000:
        return f"{size // 1_000_000} MB"
    if size >= 1000:
        return f"{size // 1000} KB"
    return f"{size} B"


# --------------------------------------------------------------------------- entry point


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_start": _loadavg(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                             timeout=10, check=False).stdout  # fmt: skip
        info["redis_version"] = next(
            (w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), "?"
        )
    try:
        import uvloop

        info["uvloop"] = uvloop.__version__
    except ImportError:
        info["uvloop"] = None
    return info


async def run(phases: Sequence[str], sz: Sizes, *, quick: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": 1,
        "started": datetime.now(UTC).isoformat(),
        "quick": quick,
        "machine": machine_info(),
        "sizes": {k: v for k, v in vars(sz).items()},
        "phases": {},
        "seconds": {},
    }
    for name in phases:
        log(f"phase {name} (load average {_loadavg()})")
        t0 = time.perf_counter()
        doc["phases"][name] = await PHASE_FUNCS[name](sz)
        doc["seconds"][name] = round(time.perf_counter() - t0, 1)
    doc["finished"] = datetime.now(UTC).isoformat()
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.scale", description=__doc__.splitlines()[0]
    )
    p.add_argument("--role", choices=("driver", "worker"), default="driver", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    p.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, from {','.join(PHASES)}"
    )
    p.add_argument("--backlog", type=int, help="tasks in the backlog phase (1,000,000)")
    p.add_argument(
        "--repeat", type=int, default=1,
        help="runs per row of the queues, payload, workers and cluster phases (median shown)",
    )  # fmt: skip
    p.add_argument("--json", type=Path, help="default benchmarks/results/scale-<date>.json")
    p.add_argument("--markdown", type=Path, help="also write the markdown report here")
    p.add_argument(
        "--images", type=Path,
        help="where the PNGs go (docs/images; with --quick benchmarks/results/quick-images)",
    )  # fmt: skip
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs (no matplotlib needed)")
    p.add_argument(
        "--from-json", type=Path, help="run nothing: redo the report and PNGs from this JSON"
    )
    args = p.parse_args(argv)
    if args.role == "worker":
        _run(worker_main(json.loads(args.config)))
        return 0
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if unknown := [x for x in phases if x not in PHASE_FUNCS]:
        p.error(f"unknown phases {unknown}; choose from {', '.join(PHASES)}")
    sz = Sizes.quick() if args.quick else Sizes()
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    sz = Sizes(**{**vars(sz), "repeat": args.repeat})
    if args.backlog:
        sz = Sizes(**{**vars(sz), "backlog": args.backlog})
    _quiet()
    if args.from_json:
        doc = json.loads(args.from_json.read_text())
        args.quick = doc["quick"]
        report = render(doc)
        print(report)
    else:
        doc = _run(run(phases, sz, quick=args.quick))
        report = render(doc)
        print(report)
        stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
        out = args.json or RESULTS / f"scale-{stamp}{'-quick' if args.quick else ''}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        doc["markdown"] = report
        out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        log(f"wrote {out}")
    if args.markdown:
        args.markdown.write_text(report)
    if not args.no_plots:
        images = args.images or (RESULTS / "quick-images" if args.quick else IMAGES)
        for path in plot(doc, images):
            log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
