"""Worker subprocesses, paced producers, the drain wait and the final check."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from asyncq import (
    Client,
    Connection,
    Inspector,
    ReplicationTimeoutError,
    Task,
    TaskIdConflictError,
)
from chaos.ledger import Fault, LedgerView, duplicates, read_ledger
from chaos.procs import RedisProc
from chaos.worker import DURABLE

__all__ = ["Figures", "Harness", "faketime_library"]

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "default"
# asynq's key layout (wire format, the same for Go asynq): what the check reads directly.
PREFIX = f"asynq:{{{QUEUE}}}:"
FINISHING = ("work", DURABLE)
"""Kinds of task whose handler never fails: each must finish (the others are poison)."""


def faketime_library() -> str | None:
    """libfaketime's LD_PRELOAD library when the machine has it (Debian: apt install faketime)."""
    for candidate in (
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ):
        if os.path.exists(candidate):
            return candidate
    return None


@dataclass
class Figures:
    scenario: str
    tasks: int = 0
    kills: int = 0
    lost: int = 0
    duplicates: int = 0
    explained: int = 0
    drain_s: float = 0.0
    duration_s: float = 0.0
    leftover: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def unexplained(self) -> int:
        return self.duplicates - self.explained

    @property
    def ok(self) -> bool:
        return (
            not self.error
            and self.lost == 0
            and self.unexplained == 0
            and self.leftover == 0
            and self.tasks > 0
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "ok": self.ok,
            "tasks": self.tasks,
            "kills": self.kills,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "explained_duplicates": self.explained,
            "unexplained_duplicates": self.unexplained,
            "leftover": self.leftover,
            "time_to_drain_s": round(self.drain_s, 2),
            "duration_s": round(self.duration_s, 2),
            "notes": self.notes,
            "error": self.error,
        }


@dataclass
class Worker:
    proc: asyncio.subprocess.Process
    args: list[str]
    env: dict[str, str]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


class Harness:
    """One scenario's ledger Redis, workers, producer state and faults."""

    def __init__(self, name: str, url: str, *, lease: float = 4.0) -> None:
        self.name = name
        self.url = url
        self.lease = lease
        self.ledger_proc = RedisProc()
        self.ledger: Redis | None = None
        self.logs = Path(tempfile.mkdtemp(prefix=f"asyncq-chaos-{name}-"))
        self.workers: list[Worker] = []
        self.dead: list[Worker] = []
        self.acked: dict[str, str] = {}  # task id -> kind
        self.enqueue_retries = 0
        self.faults: list[Fault] = []
        self.figures = Figures(name)
        self.t0 = time.time()
        self.exited: list[Worker] = []  # exited without being told to
        self._watch: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Harness:
        self.ledger_proc.start()
        self.ledger = Redis.from_url(self.ledger_proc.url)
        self._watch = asyncio.create_task(self._watch_exits())
        return self

    async def _watch_exits(self) -> None:
        """Record a worker that dies on its own as a fault (it explains re-runs, and fails)."""
        while True:
            for w in list(self.workers):
                if w.proc.returncode is not None:
                    now = time.time()
                    self.faults.append(Fault("exited", now - 0.3, now, w.pid))
                    self.workers.remove(w)
                    self.exited.append(w)
            await asyncio.sleep(0.2)

    async def __aexit__(self, *exc: object) -> None:
        if self._watch is not None:
            self._watch.cancel()
        for w in self.workers:
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(w.proc.wait(), 10)
        if self.ledger is not None:
            await self.ledger.aclose()
        self.ledger_proc.cleanup()
        if self.figures.ok:
            shutil.rmtree(self.logs, ignore_errors=True)
        else:
            self.figures.notes["logs"] = str(self.logs)

    # -- workers -------------------------------------------------------------------------

    async def spawn(
        self,
        *,
        url: str | None = None,
        concurrency: int = 10,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> Worker:
        assert self.ledger is not None
        args = [
            "--redis", url or self.url,
            "--ledger", self.ledger_proc.url,
            "--concurrency", str(concurrency),
            "--lease", str(self.lease),
            "--heartbeat", str(max(0.2, self.lease / 4)),
            *extra,
        ]  # fmt: skip
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        return await self._start(args, full_env, wait)

    async def _start(self, args: list[str], env: dict[str, str], wait: bool) -> Worker:
        log = self.logs / f"worker-{len(self.workers) + len(self.dead)}.log"
        with log.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "chaos.worker", *args,
                cwd=str(ROOT), env=env, stdout=out, stderr=out,
            )  # fmt: skip
        worker = Worker(proc, args, env, log)
        self.workers.append(worker)
        if wait:
            await self.wait_ready(worker)
        return worker

    async def wait_ready(self, worker: Worker, within: float = 60) -> None:
        assert self.ledger is not None
        deadline = time.monotonic() + within
        needle = f"R - - {worker.pid} ".encode()
        while time.monotonic() < deadline:
            if worker.proc.returncode is not None:
                raise RuntimeError(f"worker {worker.pid} exited early; see {worker.log}")
            records: Any = await self.ledger.lrange("chaos:ledger", -200, -1)
            for raw in records:
                if raw.startswith(needle):
                    return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"worker {worker.pid} not ready after {within}s; see {worker.log}")

    async def kill(self, worker: Worker, *, restart: bool = True) -> Worker | None:
        """SIGKILL *worker* (recorded as a fault); start a replacement with the same args."""
        if worker not in self.workers:
            return None  # exited on its own meanwhile (already recorded)
        self.workers.remove(worker)  # before the signal: not mistaken for an exit of its own
        with contextlib.suppress(ProcessLookupError):
            worker.proc.send_signal(signal.SIGKILL)
        await worker.proc.wait()
        now = time.time()
        self.faults.append(Fault("kill", now, now, worker.pid))
        self.figures.kills += 1
        self.dead.append(worker)
        if restart:
            return await self._start(worker.args, worker.env, wait=False)
        return None

    async def stop_workers(self) -> None:
        """SIGTERM every worker; count the ones that had already exited on their own."""
        if self._watch is not None:
            self._watch.cancel()
        unexpected = self.exited + [w for w in self.workers if w.proc.returncode is not None]
        for w in self.workers:
            if w.proc.returncode is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                await asyncio.wait_for(w.proc.wait(), 20)
            except TimeoutError:
                w.proc.kill()
                await w.proc.wait()
        if unexpected:
            self.figures.notes["workers_exited_on_their_own"] = [
                f"pid {w.pid} exit {w.proc.returncode}" for w in unexpected
            ]
            self.figures.error = (
                f"{len(unexpected)} worker(s) exited without being told to; see "
                + ", ".join(str(w.log) for w in unexpected)
            )

    def _log_lines(self, task_ids: Iterable[str], limit: int = 20) -> list[str]:
        """The worker log lines naming one of *task_ids*: what a CI log shows of a failure
        once its temporary directory is gone."""
        wanted = set(task_ids)
        lines: list[str] = []
        for w in [*self.workers, *self.dead, *self.exited]:
            with contextlib.suppress(OSError):
                for line in w.log.read_text(errors="replace").splitlines():
                    if any(tid in line for tid in wanted) and len(lines) < limit:
                        lines.append(f"{w.pid}: {line[:400]}")
        return lines

    # -- producing -----------------------------------------------------------------------

    async def produce(
        self,
        client: Client,
        count: int,
        *,
        seconds: float,
        kind: str = "work",
        payload: dict[str, Any] | None = None,
        batch: int = 50,
        ms: tuple[int, int] = (0, 20),
        max_retry: int | None = None,
        retention: float | None = None,
        give_up_after: float = 60.0,
    ) -> None:
        """Enqueue *count* tasks evenly over *seconds*, retrying failed items (same ids);
        *retention* (s) keeps their results readable after success.

        A task counts as acknowledged when enqueue_many returned it written, or
        TaskIdConflictError on a retry (an earlier attempt did write it).
        """
        started = time.monotonic()
        rng = random.Random(count)
        made = 0
        while made < count:
            n = min(batch, count - made)
            tasks: list[tuple[str, Task]] = []
            for _ in range(n):
                data = payload if payload is not None else {"ms": rng.randint(*ms)}
                tasks.append((str(uuid.uuid4()), Task.from_json(kind, data)))
            opts: dict[str, Any] = {} if max_retry is None else {"max_retry": max_retry}
            if retention is not None:
                opts["retention"] = timedelta(seconds=retention)
            await self._enqueue_all(client, tasks, kind, opts, give_up_after)
            made += n
            ahead = started + seconds * made / count - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)

    async def _enqueue_all(
        self,
        client: Client,
        tasks: list[tuple[str, Task]],
        kind: str,
        opts: dict[str, Any],
        give_up_after: float,
    ) -> None:
        todo = tasks
        tried: set[str] = set()
        deadline = time.monotonic() + give_up_after
        while todo:
            items = [(task, {"task_id": tid, **opts}) for tid, task in todo]
            try:
                results: list[Any] = await client.enqueue_many(items)  # type: ignore[arg-type]
            except Exception as exc:
                results = [exc] * len(todo)
            again = []
            for (tid, task), result in zip(todo, results, strict=True):
                written = not isinstance(result, BaseException)
                if written or (isinstance(result, TaskIdConflictError) and tid in tried):
                    self.acked[tid] = kind
                else:
                    if not isinstance(result, ReplicationTimeoutError | TaskIdConflictError):
                        self.figures.notes["last_enqueue_error"] = repr(result)[:200]
                    again.append((tid, task))
            tried.update(tid for tid, _ in todo)
            if again:
                self.enqueue_retries += len(again)
                if time.monotonic() > deadline:
                    self.figures.notes["enqueues_given_up"] = self.figures.notes.get(
                        "enqueues_given_up", 0
                    ) + len(again)
                    return
                await asyncio.sleep(0.2)
            todo = again

    # -- draining and checking -----------------------------------------------------------

    async def drain(self, conn: Connection, *, within: float = 120.0) -> LedgerView:
        """Wait until every acknowledged task finished and the queue holds nothing in flight."""
        assert self.ledger is not None
        started = last_progress = time.monotonic()
        # Recovery of a dead worker's tasks takes about a lease; longer without a single
        # new ledger record means the workers are wedged.
        idle_limit = 20 + 2 * self.lease
        records = -1
        view = await read_ledger(self.ledger)
        while time.monotonic() - started < within:
            view = await read_ledger(self.ledger)
            if not self.workers:
                self.figures.notes["drain_stopped"] = "no worker left alive"
                break
            now_records = await self.ledger.llen("chaos:ledger")
            if now_records != records:
                records, last_progress = now_records, time.monotonic()
            elif time.monotonic() - last_progress > idle_limit:
                why = await self._why_stalled(conn, view, idle_limit)
                self.figures.notes["drain_stopped"] = why
                break
            if all(self._settled(view, tid, kind) for tid, kind in self.acked.items()):
                with contextlib.suppress(Exception):
                    if await self.in_flight(conn) == 0 and await self._poison_settled(conn):
                        break
            await asyncio.sleep(0.25)
        self.figures.drain_s = time.monotonic() - started
        return view

    async def _why_stalled(self, conn: Connection, view: LedgerView, idle: float) -> str:
        """Why the drain gave up after *idle* seconds without a handler running: the workers
        are wedged while tasks are in flight; with nothing in flight, the unsettled tasks
        are nowhere for a worker to take (lost, unless the check finds them elsewhere)."""
        missing = sum(1 for tid, kind in self.acked.items() if not self._settled(view, tid, kind))
        try:
            in_flight = await self.in_flight(conn)
        except Exception as exc:  # Redis down at the end: say so rather than guess
            return f"no handler ran for {idle:.0f}s; the queue could not be read ({exc!r})"
        if in_flight:
            return (
                f"no handler ran for {idle:.0f}s with {in_flight} in flight: the workers are wedged"
            )
        return (
            f"no handler ran for {idle:.0f}s and nothing is in flight: {missing} acknowledged "
            "task(s) not run are not in the queue"
        )

    def _settled(self, view: LedgerView, tid: str, kind: str) -> bool:
        return view.finished(tid) if kind in FINISHING else view.started(tid)

    async def in_flight(self, conn: Connection) -> int:
        redis = conn.redis
        counts = [
            await redis.llen(PREFIX + "pending"),
            await redis.llen(PREFIX + "active"),
            await redis.zcard(PREFIX + "lease"),
            await redis.zcard(PREFIX + "scheduled"),
            await redis.zcard(PREFIX + "retry"),
        ]
        return sum(int(c) for c in counts)

    async def _poison_settled(self, conn: Connection) -> bool:
        poison = [tid for tid, kind in self.acked.items() if kind not in FINISHING]
        if not poison:
            return True
        members: Any = await conn.redis.zrange(PREFIX + "archived", 0, -1)
        archived = {m.decode() for m in members}
        assert self.ledger is not None
        view = await read_ledger(self.ledger)
        return all(tid in archived or view.finished(tid) for tid in poison)

    async def check(self, conn: Connection, view: LedgerView) -> Figures:
        fig = self.figures
        work = [tid for tid, kind in self.acked.items() if kind in FINISHING]
        poison = {tid: kind for tid, kind in self.acked.items() if kind not in FINISHING}
        # A durable run's steps, ids "<run id>-<index>", must not run twice unexplained either.
        runs = {tid for tid, kind in self.acked.items() if kind == DURABLE}
        steps = [tid for tid in view.runs if tid.rsplit("-", 1)[0] in runs]
        fig.tasks = len(self.acked)
        lost = [tid for tid in work if not view.finished(tid)]
        lost += [tid for tid in poison if not view.started(tid)]
        async with Inspector(conn.redis) as inspector:
            archived = {t.id for t in await _all_archived(inspector)}
            info = await inspector.queue_info(QUEUE)
        lost += [tid for tid in work if tid in archived]  # a handler that never fails, archived
        # A poison pill ends archived (its retries used up) or finished (a stall that
        # the worker survived with its lease); anything else is still in flight.
        not_archived = [tid for tid in poison if tid not in archived and not view.finished(tid)]
        fig.lost = len(set(lost))
        fig.leftover = await self.in_flight(conn) + len(not_archived)
        unexplained: list[str] = []
        fig.duplicates, fig.explained = duplicates(view, [*work, *steps], self.faults, unexplained)
        if unexplained:
            fig.notes["unexplained_sample"] = unexplained
            fig.notes["unexplained_logs"] = self._log_lines(s.split(":", 1)[0] for s in unexplained)
            fig.notes["stalls"] = [f"{f.pid}@{f.start:.3f}-{f.end:.3f}" for f in view.stalls]
        fig.notes["enqueue_retries"] = self.enqueue_retries
        fig.notes["queue_after"] = {
            "pending": info.pending,
            "active": info.active,
            "scheduled": info.scheduled,
            "retry": info.retry,
            "archived": info.archived,
        }
        if poison:
            kinds: dict[str, dict[str, int]] = {}
            for tid, kind in poison.items():
                row = kinds.setdefault(kind, {"tasks": 0, "runs": 0, "archived": 0, "finished": 0})
                row["tasks"] += 1
                row["runs"] += len(view.runs.get(tid, []))
                row["archived"] += tid in archived
                row["finished"] += view.finished(tid)
            fig.notes["poison"] = kinds
        if lost:
            fig.notes["lost_sample"] = sorted(set(lost))[:5]
        fig.duration_s = time.time() - self.t0
        return fig


async def _all_archived(inspector: Inspector) -> list[Any]:
    out: list[Any] = []
    page = 1
    while True:
        batch = await inspector.list_archived(QUEUE, page=page, size=1000)
        out.extend(batch)
        if len(batch) < 1000:
            return out
        page += 1
