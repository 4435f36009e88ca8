"""The measuring driver shared by every per-system script (standard library only).

A system script (``python -m benchmarks.systems.<name> --url redis://...``) defines a
:class:`System` adapter and calls :func:`main`. The *driver* role runs the phases in
order and prints one JSON object per line on stdout:

``meta`` -> ``enqueue_serial`` -> ``enqueue_fast`` -> ``process`` -> ``leftovers`` ->
``latency``.

Processing and latency run a worker in a child process (the same script with
``--role worker``), so the worker's CPU time is its own and pickup latency crosses
a process boundary. Redis-side figures come from ``INFO commandstats`` (after
``CONFIG RESETSTAT``) and ``INFO cpu``, read over a tiny blocking RESP connection
that is independent of the Redis client library under test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import math
import platform
import re
import resource
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = [
    "Config",
    "Producer",
    "Resp",
    "System",
    "Timed",
    "gather_enqueue",
    "main",
]

SCHEMA_VERSION = 1
PEER_LOGGERS = (
    "arq", "saq", "streaq", "taskiq", "taskiq_redis", "coredis", "asyncq", "bullmq"
)  # fmt: skip


# --------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class Config:
    """What one system run measures; the defaults are the full run of peers.md §3."""

    url: str
    n: int = 20_000
    serial_n: int = 5_000
    latency_n: int = 200
    latency_interval_ms: float = 10.0
    latency_warmup: int = 10
    concurrency: int = 100
    fast_width: int = 32
    batch_size: int = 0
    settle: float = 1.0
    timeout: float = 0.0
    variant: str = ""

    def __post_init__(self) -> None:
        for name in ("n", "serial_n", "latency_n", "concurrency", "fast_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("latency_warmup", "batch_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.latency_interval_ms <= 0 or self.settle < 0 or self.timeout < 0:
            raise ValueError("latency_interval_ms must be > 0, settle and timeout >= 0")

    @property
    def worker_timeout(self) -> float:
        """Seconds a worker may take before its phase is reported as timed out."""
        return self.timeout or 60.0 + max(self.n, self.latency_n) / 200.0

    @classmethod
    def quick(cls, url: str, **overrides: Any) -> Config:
        """Small sizes for a CI smoke run (a few seconds per system)."""
        base: dict[str, Any] = {
            "n": 500,
            "serial_n": 200,
            "latency_n": 20,
            "latency_warmup": 3,
            "settle": 0.3,
            "timeout": 60.0,
        }
        base.update(overrides)
        return cls(url=url, **base)


# --------------------------------------------------------------------------- adapters


@dataclasses.dataclass(frozen=True)
class Timed:
    """One timed enqueue loop: wall seconds, the enqueuing process's CPU seconds,
    the per-call latencies in seconds (per-call phases only) and failed items."""

    seconds: float
    cpu_s: float
    latencies: list[float] = dataclasses.field(default_factory=list)
    errors: int = 0


class Producer:
    """Enqueues no-op tasks carrying an integer index; one per enqueue phase.

    A system implements :meth:`enqueue` (and :meth:`enqueue_fast` when it has a
    batch API). The three timed loops below run in this process by default; a system
    whose library lives in another runtime (BullMQ for Node) overrides them so that the
    loops run, and are timed, in the process that enqueues.
    """

    async def enqueue(self, i: int) -> None:
        """Enqueue one task for index *i* and wait until the library says it is stored."""
        raise NotImplementedError

    async def enqueue_fast(self, indices: Sequence[int], cfg: Config) -> int:
        """The system's fastest way to enqueue many tasks; returns how many failed.

        Default: ``cfg.fast_width`` concurrent :meth:`enqueue` calls (asyncio.gather),
        for systems without a batch API.
        """
        await gather_enqueue(self.enqueue, indices, cfg.fast_width)
        return 0

    async def timed_calls(self, indices: Sequence[int], callers: int) -> Timed:
        """*callers* coroutines sharing this producer, each timing its ``enqueue`` calls."""
        latencies: list[float] = []
        clock = time.perf_counter
        record_latency = latencies.append

        async def timed(i: int) -> None:
            start = clock()
            await self.enqueue(i)
            record_latency(clock() - start)

        cpu0 = cpu_seconds()
        t0 = clock()
        await gather_enqueue(timed, indices, callers)
        return Timed(clock() - t0, cpu_seconds() - cpu0, latencies)

    async def timed_fast(self, indices: Sequence[int], cfg: Config) -> Timed:
        """:meth:`enqueue_fast`, timed."""
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        errors = await self.enqueue_fast(indices, cfg)
        return Timed(time.perf_counter() - t0, cpu_seconds() - cpu0, errors=errors)

    async def paced(
        self, warmup: Sequence[int], indices: Sequence[int], interval: float, idle: float
    ) -> dict[int, tuple[float, float]]:
        """The latency phase's sends: *warmup* tasks *interval* seconds apart, *idle*
        seconds of nothing, then *indices* on a fixed *interval* cadence. For each of
        *indices*: ``time.time()`` just before the enqueue call and just after it returned."""
        for i in warmup:
            await self.enqueue(i)
            await asyncio.sleep(interval)
        await asyncio.sleep(idle)
        sent: dict[int, tuple[float, float]] = {}
        tick = time.perf_counter()
        for i in indices:
            before = time.time()
            await self.enqueue(i)
            sent[i] = (before, time.time())
            tick += interval
            await asyncio.sleep(max(0.0, tick - time.perf_counter()))
        return sent


class System:
    """One queue library under test. Subclasses fill in the names and the three hooks."""

    name: str = ""
    fast_path: str = "32 concurrent enqueue() calls (asyncio.gather)"
    retention: str = ""
    distributions: tuple[str, ...] = ()

    def versions(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for dist in (*self.distributions, "hiredis", "uvloop"):
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                out[dist] = importlib.metadata.version(dist)
        return out

    def producer(self, cfg: Config) -> AbstractAsyncContextManager[Producer]:
        """A connected producer (connection setup is not timed)."""
        raise NotImplementedError

    async def serve(self, cfg: Config, on_task: Callable[[int], None], stop: asyncio.Event) -> None:
        """Run one worker (concurrency ``cfg.concurrency``) whose no-op handler calls
        ``on_task(i)`` first thing; when *stop* is set, shut it down gracefully and return."""
        raise NotImplementedError

    def worker_command(self, module: str, mode: str, cfg_json: str) -> list[str]:
        """The worker child process: this script with ``--role worker`` by default. It
        prints ``{"event": "started"}`` and then the ``result`` record of :func:`worker_main`."""
        return [sys.executable, "-m", module, "--role", "worker", "--mode", mode,
                "--config", cfg_json]  # fmt: skip


async def gather_enqueue(
    enqueue: Callable[[int], Awaitable[None]], indices: Iterable[int], width: int
) -> None:
    """*width* coroutines, each awaiting one enqueue at a time, sharing one index stream."""
    it = iter(indices)

    async def lane() -> None:
        for i in it:
            await enqueue(i)

    await asyncio.gather(*(lane() for _ in range(width)))


# --------------------------------------------------------------------------- redis probe


class RespError(Exception):
    """An error reply from Redis."""


class Resp:
    """A minimal blocking RESP2 connection for stats and inspection (never on a hot path)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", ""):
            raise ValueError(f"only redis:// URLs are supported by the benchmark, got {url!r}")
        self.sock = socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 6379), timeout
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")
        if parts.password:
            auth = [unquote(parts.password)]
            if parts.username:
                auth.insert(0, unquote(parts.username))
            self.call("AUTH", *auth)
        self.db = int(parts.path.lstrip("/") or 0)
        if self.db:
            self.call("SELECT", self.db)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    @staticmethod
    def _encode(args: Sequence[object]) -> bytes:
        out = [b"*%d\r\n" % len(args)]
        for arg in args:
            b = arg if isinstance(arg, bytes) else str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        return b"".join(out)

    def _read(self) -> Any:
        line = self.reader.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest
        if kind == b"-":
            return RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self.reader.read(size + 2)
            return data[:-2]
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._read() for _ in range(size)]
        raise ConnectionError(f"unexpected RESP reply {line!r}")

    def call(self, *args: object) -> Any:
        self.sock.sendall(self._encode(args))
        reply = self._read()
        if isinstance(reply, RespError):
            raise reply
        return reply

    def pipeline(self, commands: Sequence[Sequence[object]]) -> list[Any]:
        """Send all *commands*, then read all replies (errors come back as RespError)."""
        if not commands:
            return []
        self.sock.sendall(b"".join(self._encode(c) for c in commands))
        return [self._read() for _ in commands]

    def info(self, section: str) -> dict[str, str]:
        raw: bytes = self.call("INFO", section)
        out: dict[str, str] = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#") and ":" in line:
                key, _, value = line.partition(":")
                out[key] = value
        return out

    def cpu_seconds(self) -> float:
        info = self.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def used_memory(self) -> int:
        return int(self.info("memory")["used_memory"])


_OWN_COMMANDS = {"info", "config|resetstat", "config"}


class RedisMeter:
    """Redis commands and redis-server CPU seconds between :meth:`start` and :meth:`stop`."""

    def __init__(self, resp: Resp) -> None:
        self.resp = resp
        self.cpu0 = 0.0

    def start(self) -> None:
        self.resp.call("CONFIG", "RESETSTAT")
        self.cpu0 = self.resp.cpu_seconds()

    def stop(self) -> dict[str, Any]:
        cpu = self.resp.cpu_seconds() - self.cpu0
        by_command: dict[str, int] = {}
        for key, value in self.resp.info("commandstats").items():
            name = key.removeprefix("cmdstat_")
            if name in _OWN_COMMANDS:
                continue
            fields = dict(f.split("=", 1) for f in value.split(","))
            by_command[name] = int(fields["calls"])
        by_command = dict(sorted(by_command.items(), key=lambda kv: -kv[1]))
        return {"redis_cpu_s": cpu, "commands": sum(by_command.values()), "by_command": by_command}


def cpu_seconds() -> float:
    """User + system CPU of this process (all threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


_ID_RUN = re.compile(r"[0-9a-fA-F][0-9a-fA-F-]{7,}|\d+")
_LENGTH_COMMAND = {
    b"list": "LLEN",
    b"set": "SCARD",
    b"zset": "ZCARD",
    b"hash": "HLEN",
    b"stream": "XLEN",
    b"string": "STRLEN",
}


def key_pattern(key: bytes) -> str:
    """*key* with ids, uuids, hex digests, dates and numbers folded into ``*``."""
    return _ID_RUN.sub("*", key.decode(errors="backslashreplace"))


def inspect_keys(resp: Resp, batch: int = 500) -> dict[str, Any]:
    """What is left in the database: key count, keys without a TTL, and keys by pattern."""
    keys: list[bytes] = []
    cursor = b"0"
    while True:
        cursor, page = resp.call("SCAN", cursor, "COUNT", 1000)
        keys.extend(page)
        if cursor == b"0":
            break
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for start in range(0, len(keys), batch):
        chunk = keys[start : start + batch]
        meta = resp.pipeline([c for k in chunk for c in (("TYPE", k), ("PTTL", k))])
        types, ttls = meta[0::2], meta[1::2]
        sizes = resp.pipeline(
            [(_LENGTH_COMMAND.get(t, "EXISTS"), k) for k, t in zip(chunk, types, strict=True)]
        )
        for key, kind, ttl, size in zip(chunk, types, ttls, sizes, strict=True):
            kind_s = kind.decode() if isinstance(kind, bytes) else str(kind)
            g = groups.setdefault(
                (key_pattern(key), kind_s),
                {"pattern": key_pattern(key), "type": kind_s, "count": 0, "persistent": 0,
                 "elements": 0},
            )  # fmt: skip
            g["count"] += 1
            g["persistent"] += ttl == -1
            if kind_s != "string" and isinstance(size, int):
                g["elements"] += size
    patterns = sorted(groups.values(), key=lambda g: (-g["count"], g["pattern"]))
    return {
        "dbsize": len(keys),
        "persistent_keys": sum(g["persistent"] for g in patterns),
        "patterns": patterns[:25],
    }


# --------------------------------------------------------------------------- output


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default) of an ascending sequence."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def per_task(value: float, n: int, scale: float = 1.0) -> float:
    return round(value * scale / n, 3)


# --------------------------------------------------------------------------- worker role


class Counter:
    """Counts handler calls by task index; ``done`` fires when every index ran once."""

    def __init__(self, n: int, *, record_starts: bool) -> None:
        self.n = n
        self.calls = 0
        self.distinct = 0
        self.unexpected = 0
        self.flags = bytearray(n)
        self.starts: dict[int, float] | None = {} if record_starts else None
        self.done = asyncio.Event()
        self.done_at = 0.0

    def __call__(self, i: int) -> None:
        if self.starts is not None and i not in self.starts:
            self.starts[i] = time.time()
        self.calls += 1
        if not 0 <= i < self.n:
            self.unexpected += 1
            return
        if not self.flags[i]:
            self.flags[i] = 1
            self.distinct += 1
            if self.distinct == self.n:
                self.done_at = time.perf_counter()
                self.done.set()


async def worker_main(system: System, cfg: Config, mode: str) -> None:
    n = cfg.n if mode == "process" else cfg.latency_n + cfg.latency_warmup
    counter = Counter(n, record_starts=mode == "latency")
    resp = Resp(cfg.url)
    meter = RedisMeter(resp)
    stop = asyncio.Event()
    meter.start()
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    serve = asyncio.create_task(system.serve(cfg, counter, stop))
    await asyncio.sleep(0.05)
    emit({"event": "started"})

    done_wait = asyncio.create_task(counter.done.wait())
    await asyncio.wait(
        {serve, done_wait}, timeout=cfg.worker_timeout, return_when=asyncio.FIRST_COMPLETED
    )
    timed_out = not counter.done.is_set()
    end = counter.done_at if not timed_out else time.perf_counter()
    if not timed_out and not serve.done():
        # Late duplicates (a sweeper re-running a task, a redelivery) still count, and the
        # acknowledgements of the last tasks land after their handlers returned: CPU and
        # commands are read after this settle time, throughput stops at the last handler.
        await asyncio.sleep(cfg.settle)
    end_cpu = cpu_seconds()
    stats = meter.stop()
    done_wait.cancel()
    stop.set()
    error: str | None = None
    try:
        await asyncio.wait_for(serve, 30.0)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    result: dict[str, Any] = {
        "event": "result",
        "mode": mode,
        "n": n,
        "seconds": end - t0,
        "worker_cpu_s": end_cpu - cpu0,
        "handler_calls": counter.calls,
        "distinct": counter.distinct,
        "unexpected": counter.unexpected,
        "timed_out": timed_out,
        "error": error,
        **stats,
    }
    if counter.starts is not None:
        result["starts"] = {str(k): v for k, v in counter.starts.items()}
    emit(result)
    resp.close()


# --------------------------------------------------------------------------- driver role


class WorkerProcess:
    """A worker child process running the same system script with ``--role worker``."""

    def __init__(self, system: System, module: str, cfg: Config, mode: str) -> None:
        self.system = system
        self.module = module
        self.cfg = cfg
        self.mode = mode
        self.proc: asyncio.subprocess.Process | None = None
        self.started = asyncio.Event()
        self.result: asyncio.Future[dict[str, Any]] | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        cfg_json = json.dumps(dataclasses.asdict(self.cfg))
        command = self.system.worker_command(self.module, self.mode, cfg_json)
        self.proc = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
        self.result = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read())
        started = asyncio.create_task(self.started.wait())
        waiters: set[asyncio.Future[Any]] = {started, self.result}
        await asyncio.wait(waiters, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if not self.started.is_set():
            await self.kill()
            if self.result.done() and self.result.exception() is not None:
                raise RuntimeError(
                    f"{self.mode} worker failed to start"
                ) from self.result.exception()
            raise RuntimeError(f"{self.mode} worker did not start within 60 s")

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        assert self.result is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            try:
                record = json.loads(line) if line.startswith("{") else None
            except json.JSONDecodeError:
                record = None
            if record is None:
                if line:
                    print(f"[{self.mode} worker] {line}", file=sys.stderr)
                continue
            if record.get("event") == "started":
                self.started.set()
            elif record.get("event") == "result" and not self.result.done():
                self.result.set_result(record)
        rc = await self.proc.wait()
        if not self.result.done():
            self.result.set_exception(RuntimeError(f"{self.mode} worker exited with code {rc}"))

    async def wait_result(self) -> dict[str, Any]:
        assert self.result is not None and self.proc is not None
        try:
            record = await asyncio.wait_for(
                asyncio.shield(self.result), self.cfg.worker_timeout + 60
            )
        except BaseException:
            await self.kill()
            raise
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            await self.kill()
        return record

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


def _enqueue_record(
    phase: str, n: int, seconds: float, cpu: float, stats: dict[str, Any], *, errors: int
) -> dict[str, Any]:
    return {
        "phase": phase,
        "n": n,
        "seconds": round(seconds, 6),
        "tasks_per_s": round(n / seconds, 1),
        "client_cpu_us_per_task": per_task(cpu, n, 1e6),
        "redis_cpu_us_per_task": per_task(stats["redis_cpu_s"], n, 1e6),
        "redis_cmds_per_task": per_task(stats["commands"], n),
        "by_command": stats["by_command"],
        "errors": errors,
    }


CALLERS = {"enqueue_serial": 1, "enqueue_c32": 32, "enqueue_c1000": 1000}
"""Concurrent callers (coroutines sharing one producer) of each per-call enqueue phase."""


async def _timed_enqueue(
    resp: Resp, system: System, cfg: Config, phase: str, n: int
) -> dict[str, Any]:
    async with system.producer(cfg) as producer:
        if phase in CALLERS:
            # one warm-up call, so that connecting is not in the per-call latencies
            await producer.enqueue(n)
            resp.call("FLUSHDB")
        meter = RedisMeter(resp)
        meter.start()
        if phase in CALLERS:
            timed = await producer.timed_calls(range(n), CALLERS[phase])
        else:
            timed = await producer.timed_fast(range(n), cfg)
        stats = meter.stop()
    record = _enqueue_record(phase, n, timed.seconds, timed.cpu_s, stats, errors=timed.errors)
    if phase == "enqueue_fast":
        record["method"] = system.fast_path
    if timed.latencies:
        latencies = sorted(timed.latencies)
        record["callers"] = CALLERS[phase]
        record["p50_ms"] = round(percentile(latencies, 50) * 1e3, 4)
        record["p99_ms"] = round(percentile(latencies, 99) * 1e3, 4)
    return record


async def driver_main(system: System, cfg: Config, module: str) -> None:
    resp = Resp(cfg.url)
    loop = asyncio.get_running_loop()
    emit(
        {
            "phase": "meta",
            "schema": SCHEMA_VERSION,
            "system": system.name,
            "variant": cfg.variant,
            "versions": system.versions(),
            "python": platform.python_version(),
            "event_loop": f"{type(loop).__module__}.{type(loop).__name__}",
            "redis_version": resp.info("server").get("redis_version", "?"),
            "config": dataclasses.asdict(cfg) | {"url": None},
            "retention": system.retention,
            "fast_path": system.fast_path,
        }
    )

    # 1. serial enqueue, one await at a time (the web-request pattern)
    resp.call("FLUSHDB")
    emit(await _timed_enqueue(resp, system, cfg, "enqueue_serial", cfg.serial_n))

    # 1b. many callers on one producer: a busy web app (32) and a very busy one (1,000)
    for phase in ("enqueue_c32", "enqueue_c1000"):
        resp.call("FLUSHDB")
        emit(await _timed_enqueue(resp, system, cfg, phase, cfg.n))

    # 2. fast-path enqueue of N; these tasks are the processing backlog
    resp.call("FLUSHDB")
    memory0 = resp.used_memory()
    emit(await _timed_enqueue(resp, system, cfg, "enqueue_fast", cfg.n))

    # 3. processing: one worker process drains the N pre-enqueued tasks
    worker = WorkerProcess(system, module, cfg, "process")
    await worker.start()
    res = await worker.wait_result()
    n = cfg.n
    emit(
        {
            "phase": "process",
            "n": n,
            "concurrency": cfg.concurrency,
            "seconds": round(res["seconds"], 6),
            "tasks_per_s": round(res["distinct"] / res["seconds"], 1) if res["seconds"] else 0,
            "worker_cpu_us_per_task": per_task(res["worker_cpu_s"], n, 1e6),
            "redis_cpu_us_per_task": per_task(res["redis_cpu_s"], n, 1e6),
            "redis_cmds_per_task": per_task(res["commands"], n),
            "by_command": res["by_command"],
            "handler_calls": res["handler_calls"],
            "handler_calls_minus_n": res["handler_calls"] - n,
            "duplicates": res["handler_calls"] - res["distinct"] - res["unexpected"],
            "lost": n - res["distinct"],
            "timed_out": res["timed_out"],
            "error": res["error"],
        }
    )

    # 4. what the N processed tasks left behind, once the worker has shut down
    emit(
        {
            "phase": "leftovers",
            "n": n,
            **inspect_keys(resp),
            "used_memory_delta": resp.used_memory() - memory0,
            "retention": system.retention,
        }
    )

    # 5. pickup latency into an idle worker in another process
    resp.call("FLUSHDB")
    emit(await _latency(system, cfg, module))
    resp.close()


async def _latency(system: System, cfg: Config, module: str) -> dict[str, Any]:
    worker = WorkerProcess(system, module, cfg, "latency")
    await worker.start()
    interval = cfg.latency_interval_ms / 1000.0
    try:
        async with system.producer(cfg) as producer:
            # 0.5 s after the warm-up lets the worker go idle (blocked or polling)
            sent = await producer.paced(
                range(cfg.latency_warmup),
                range(cfg.latency_warmup, cfg.latency_warmup + cfg.latency_n),
                interval,
                0.5,
            )
    except BaseException:
        await worker.kill()
        raise
    res = await worker.wait_result()
    starts: dict[str, float] = res.get("starts", {})
    from_call = sorted(
        (starts[str(i)] - b) * 1000 for i, (b, _) in sent.items() if str(i) in starts
    )
    from_ack = sorted((starts[str(i)] - a) * 1000 for i, (_, a) in sent.items() if str(i) in starts)
    expected = cfg.latency_n + cfg.latency_warmup
    return {
        "phase": "latency",
        "n": cfg.latency_n,
        "interval_ms": cfg.latency_interval_ms,
        "samples": len(from_call),
        "p50_ms": round(percentile(from_call, 50), 4),
        "p90_ms": round(percentile(from_call, 90), 4),
        "p99_ms": round(percentile(from_call, 99), 4),
        "max_ms": round(from_call[-1], 4) if from_call else math.nan,
        "mean_ms": round(sum(from_call) / len(from_call), 4) if from_call else math.nan,
        "p50_ms_after_enqueue_returned": round(percentile(from_ack, 50), 4),
        "p99_ms_after_enqueue_returned": round(percentile(from_ack, 99), 4),
        "handler_calls_minus_n": res["handler_calls"] - expected,
        "lost": expected - res["distinct"],
        "timed_out": res["timed_out"],
        "error": res["error"],
    }


# --------------------------------------------------------------------------- entry point


def _parse(argv: Sequence[str] | None) -> tuple[Config, str, str]:
    p = argparse.ArgumentParser(description="Benchmark one task-queue system (JSON lines out).")
    p.add_argument("--url", help="Redis URL; its database is FLUSHED between phases")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    p.add_argument("--n", type=int, help="tasks for fast-path enqueue and processing")
    p.add_argument("--serial-n", type=int, help="tasks for serial enqueue")
    p.add_argument("--latency-n", type=int, help="pickup latency samples")
    p.add_argument("--latency-interval-ms", type=float)
    p.add_argument("--latency-warmup", type=int)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--fast-width", type=int, help="concurrent enqueues for gather fast paths")
    p.add_argument("--batch-size", type=int, help="tasks per batch call (0: all at once)")
    p.add_argument("--settle", type=float, help="seconds to wait for late duplicates")
    p.add_argument("--timeout", type=float, help="seconds a worker phase may take")
    p.add_argument("--variant", help="system-specific variant (e.g. arq: poll50)")
    p.add_argument("--role", choices=("driver", "worker"), default="driver")
    p.add_argument("--mode", choices=("process", "latency"), default="process")
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.config:
        return Config(**json.loads(args.config)), args.role, args.mode
    if not args.url:
        p.error("--url is required")
    fields = {f.name for f in dataclasses.fields(Config)}
    overrides = {
        k: v for k, v in vars(args).items() if k in fields and k != "url" and v is not None
    }
    cfg = Config.quick(args.url, **overrides) if args.quick else Config(url=args.url, **overrides)
    return cfg, args.role, args.mode


def _run(coro: Awaitable[None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]
    else:
        uvloop.run(coro)  # type: ignore[arg-type]


def main(system: System, argv: Sequence[str] | None = None) -> None:
    """Entry point of a system script: driver by default, worker with ``--role worker``."""
    cfg, role, mode = _parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    for name in PEER_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    main_module = sys.modules["__main__"]
    spec = getattr(main_module, "__spec__", None)
    if spec is None:
        raise SystemExit("run system scripts as modules: python -m benchmarks.systems.<name>")
    if role == "worker":
        _run(worker_main(system, cfg, mode))
    else:
        _run(driver_main(system, cfg, spec.name))
