"""The ledger check: what ran, what was lost, and which duplicate runs a fault explains."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.worker import LEDGER

__all__ = ["ACK_WINDOW", "Fault", "LedgerView", "Run", "read_ledger"]

ACK_WINDOW = 2.0
"""Seconds after a handler's ``D`` record within which its acknowledgement may still be
on its way to Redis: a fault inside that window can lose the ack and cause a re-run."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected failure: *pid* None = the whole Redis side; [start, end] in unix time."""

    kind: str
    start: float
    end: float
    pid: int | None = None

    def explains(self, run: Run) -> bool:
        if self.pid is not None and run.pid != self.pid:
            return False
        # The run was in flight, or its acknowledgement possibly was, during the fault.
        run_end = float("inf") if run.done is None else run.done + ACK_WINDOW
        return run.start <= self.end and run_end >= self.start


@dataclass(slots=True)
class Run:
    run: str
    pid: int
    start: float
    done: float | None = None


@dataclass(slots=True)
class LedgerView:
    runs: dict[str, list[Run]] = field(default_factory=lambda: defaultdict(list))
    stalls: list[Fault] = field(default_factory=list)
    ready: dict[int, float] = field(default_factory=dict)

    def finished(self, task_id: str) -> bool:
        return any(r.done is not None for r in self.runs.get(task_id, ()))

    def started(self, task_id: str) -> bool:
        return bool(self.runs.get(task_id))


async def read_ledger(redis: Any) -> LedgerView:
    """Parse the ledger list (see chaos.worker for the record format)."""
    view = LedgerView()
    by_run: dict[str, Run] = {}
    for raw in await redis.lrange(LEDGER, 0, -1):
        parts = raw.decode().split()
        kind, tid, run, pid, at = parts[0], parts[1], parts[2], int(parts[3]), float(parts[4])
        if kind == "S":
            r = Run(run, pid, at)
            by_run[run] = r
            view.runs[tid].append(r)
        elif kind == "D":
            if run in by_run:
                by_run[run].done = at
        elif kind == "B":
            # Tasks that waited behind the stall start just after it: the window covers them.
            view.stalls.append(Fault("stall", at, at + float(parts[5]) + ACK_WINDOW, pid))
        elif kind == "R":
            view.ready[pid] = at
    for runs in view.runs.values():
        runs.sort(key=lambda r: r.start)
    return view


def duplicates(
    view: LedgerView, task_ids: Any, faults: list[Fault], unexplained: list[str] | None = None
) -> tuple[int, int]:
    """(duplicate runs, explained ones) over *task_ids* (tasks whose handler never fails).

    Every run after the first is a duplicate. It is explained when the run
    before it overlapped a fault on its worker or on Redis (in flight, or its
    acknowledgement possibly in flight, when the fault struck), or when the
    duplicate itself is the late run of a worker whose event loop stalled
    (that worker dequeued the task before or during the stall, another one
    recovered it, and the stalled one started it only afterwards).
    """
    dup = explained = 0
    allf = [*faults, *view.stalls]
    for tid in task_ids:
        runs = view.runs.get(tid, [])
        for before, after in itertools.pairwise(runs):
            dup += 1
            if any(f.explains(before) for f in allf) or any(f.explains(after) for f in view.stalls):
                explained += 1
            elif unexplained is not None and len(unexplained) < 10:
                pid_faults = [f for f in allf if f.pid in (None, before.pid)]
                unexplained.append(
                    f"{tid}: runs "
                    + ", ".join(f"{r.pid}@{r.start:.3f}-{r.done}" for r in runs)
                    + f"; faults of {before.pid}: "
                    + ", ".join(f"{f.kind}@{f.start:.3f}-{f.end:.3f}" for f in pid_faults)
                )
    return dup, explained
