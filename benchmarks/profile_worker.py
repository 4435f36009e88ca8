"""Where a worker's CPU goes per task, in one or more revisions of asyncq.

``python -m benchmarks.profile_worker REV [REV ...] [--n 20000] [--runs 2]`` installs
each revision as :mod:`benchmarks.ab` does (own virtualenv, every other package pinned
to this environment's versions; a revision is a commit, a branch, ``HEAD`` or a working
tree) and, on one throwaway redis-server over TCP, runs the ``process`` phase of
``python -m benchmarks`` in one process: N no-op tasks are written with
``enqueue_many`` (not measured), then the benchmark's own worker
(:meth:`benchmarks.systems.asyncq.Asyncq.serve`, concurrency 100) drains them, then
waits the settle time for the last acknowledgements. For each revision it prints:

- **plain runs** (``--runs``, alternating between the revisions): worker CPU µs per task
  (``getrusage``, as the benchmark measures it) and tasks/s, and the garbage collector's
  work per 1,000 tasks (collections per generation from ``gc.callbacks``, objects it
  freed, the CPU time spent in it) — cyclic garbage is what only the collector frees;
- **one run under cProfile**: Python function calls per task, and the functions with the
  most own time per task (µs, inflated by the profiler's own cost per call, so compare
  revisions with each other, not with the plain runs), then the same functions side by
  side across the revisions (matched by module-relative file name and function name,
  so a function that moved between modules is matched by its file's base name);
- with ``--cycles``, **one run with** ``gc.DEBUG_SAVEALL``: what the collector found
  unreachable, by type, per 1,000 tasks (objects that lived in reference cycles).

``--pstats DIR`` keeps each revision's profile for ``python -m pstats``. See
benchmarks/README.md ("Profiling the worker"). Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import gc
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import ab, runner
from benchmarks.systems._common import Config, Counter, Resp, cpu_seconds

# --------------------------------------------------------------------------- inner role


class GcMeter:
    """Collections, objects freed and CPU seconds spent in the collector, per generation."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.collected = 0
        self.seconds = [0.0, 0.0, 0.0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        # CPU time, not wall time: on a shared machine the process is often descheduled,
        # and a wall clock would charge the neighbours' time to the collector.
        if phase == "start":
            self._start = time.process_time()
        else:
            self.seconds[info["generation"]] += time.process_time() - self._start
            self.collections[info["generation"]] += 1
            self.collected += info["collected"]


async def _fill(url: str, n: int) -> dict[str, Any]:
    """Write the N tasks, in a process of its own as in the benchmark: the worker's heap
    (which every full collection walks) holds only what the worker made."""
    from asyncq import Client
    from benchmarks.systems.asyncq import AsyncqProducer

    resp = Resp(url)
    resp.call("FLUSHDB")
    resp.close()
    async with Client(url) as client:
        await AsyncqProducer(client).enqueue_fast(range(n), Config(url=url, n=n))
    return {"mode": "fill", "n": n}


async def _drain(
    url: str, n: int, settle: float, mode: str, pstats_out: str, *, freeze: bool
) -> dict[str, Any]:
    # The revision under test is the asyncq of this interpreter's environment.
    from benchmarks.systems.asyncq import Asyncq

    cfg = Config(url=url, n=n, settle=settle)
    resp = Resp(url)
    counter = Counter(n, record_starts=False)
    first: list[float] = []  # CPU seconds when the first handler ran: the start-up's share

    def on_task(i: int) -> None:
        if not first:
            first.append(cpu_seconds())
            if freeze:  # what the start-up made is never collected: out of every pass
                gc.freeze()
        counter(i)

    stop = asyncio.Event()
    meter = GcMeter()
    # Timed by CPU (time.process_time), not cProfile's default wall clock, for the same
    # reason; each call costs more to time, so compare revisions, not with plain runs.
    profiler = cProfile.Profile(time.process_time) if mode == "cprofile" else None
    if mode == "cycles":
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
    gc.callbacks.append(meter)
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    serve = asyncio.create_task(Asyncq().serve(cfg, on_task, stop))
    await asyncio.wait_for(counter.done.wait(), cfg.worker_timeout)
    end = counter.done_at
    await asyncio.sleep(settle)  # the last acknowledgements, as the benchmark counts them
    if profiler is not None:
        profiler.disable()
    cpu = cpu_seconds() - cpu0
    gc.callbacks.remove(meter)
    stop.set()
    await asyncio.wait_for(serve, 30)
    record: dict[str, Any] = {
        "mode": mode,
        "n": n,
        "tasks_per_s": round(n / (end - t0), 1),
        "worker_cpu_us_per_task": round(cpu * 1e6 / n, 2),
        # The benchmark's figure includes the worker's start-up (Server set-up, scripts
        # loaded, imports it makes): its CPU until the first handler ran, and the rest.
        "startup_cpu_ms": round((first[0] - cpu0) * 1e3, 1),
        "after_startup_us_per_task": round((cpu0 + cpu - first[0]) * 1e6 / n, 2),
        "gc_collections_per_1000": [round(c * 1000 / n, 2) for c in meter.collections],
        "gc_collected_per_task": round(meter.collected / n, 3),
        "gc_us_per_task": round(sum(meter.seconds) * 1e6 / n, 2),
        "gc_us_per_task_by_generation": [round(x * 1e6 / n, 2) for x in meter.seconds],
        "gc_frozen_at_first_task": freeze,
        "handler_calls_minus_n": counter.calls - n,
    }
    if profiler is not None:
        profiler.dump_stats(pstats_out)
    if mode == "cycles":
        gc.collect()
        kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        record["garbage_per_1000"] = {k: round(v * 1000 / n, 1) for k, v in kinds.most_common(25)}
        record["garbage_total_per_task"] = round(len(gc.garbage) / n, 2)
        gc.set_debug(0)
        gc.garbage.clear()
    resp.call("FLUSHDB")
    resp.close()
    return record


def inner(argv: Sequence[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--settle", type=float, default=1.0)
    p.add_argument("--mode", choices=("fill", "plain", "cprofile", "cycles"), default="plain")
    p.add_argument("--pstats", default="")
    p.add_argument("--freeze", action="store_true")
    args = p.parse_args(argv)
    import logging

    import structlog

    # the benchmark worker's logging policy (benchmarks/systems/asyncq.py): warnings only
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.mode == "fill":
        coro = _fill(args.url, args.n)
    else:
        coro = _drain(args.url, args.n, args.settle, args.mode, args.pstats, freeze=args.freeze)
    try:
        import uvloop
    except ImportError:
        record = asyncio.run(coro)
    else:
        record = uvloop.run(coro)
    sys.stdout.write(json.dumps(record) + "\n")


# --------------------------------------------------------------------------- outer role


def _run_inner(
    rev: ab.Revision, root: Path, url: str, args: argparse.Namespace, *, mode: str, out: str = ""
) -> dict[str, Any]:
    assert rev.python is not None
    base = [str(rev.python), "-m", "benchmarks.profile_worker", "--inner", "--url", url,
            "--n", str(args.n)]  # fmt: skip
    fill = [*base, "--mode", "fill"]
    drain = [*base, "--settle", str(args.settle), "--mode", mode, "--pstats", out,
             *(["--freeze"] if args.freeze else [])]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(root))
    record: dict[str, Any] = {}
    for step in (fill, drain):  # the backlog, then the measured drain
        proc = subprocess.run(
            step, cwd=root, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{rev.label} {mode}: exited {proc.returncode}: {proc.stderr[-3000:]}"
            )
        record = json.loads(proc.stdout.strip().splitlines()[-1])
    ab.log(
        f"  {rev.label} {mode}: {record['worker_cpu_us_per_task']:.1f} µs CPU/task,"
        f" {record['tasks_per_s']:,.0f} tasks/s, gc {record['gc_collections_per_1000']} per"
        f" 1,000, {record['gc_us_per_task_by_generation']} µs/task by generation"
    )
    return record


def _key(func: tuple[str, int, str]) -> str:
    """A function's name across revisions: its file from the package root, or the
    file's base name where the package moved it (asyncq/processor.py ->
    asyncq/_worker/processor.py), and its name; the line is left out (it moves)."""
    filename, _, name = func
    path = Path(filename)
    parts = path.parts
    if "asyncq" in parts:
        rel = "/".join(parts[len(parts) - parts[::-1].index("asyncq") - 1 :])
        return f"{path.name}:{name}" if "asyncq" in rel else f"{rel}:{name}"
    if filename == "~":  # a built-in: '{method 'append' of 'list' objects}'
        return name
    return f"{path.name}:{name}"


def profile_table(stats_by_rev: dict[str, pstats.Stats], n: int, top: int) -> str:
    """Own time and calls per task of the heaviest functions, every revision side by side."""
    per: dict[str, dict[str, tuple[float, float, float]]] = {}
    for label, st in stats_by_rev.items():
        rows: dict[str, tuple[float, float, float]] = {}
        for func, (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
            k = _key(func)
            own, calls, cum = rows.get(k, (0.0, 0.0, 0.0))
            rows[k] = (own + tt * 1e6 / n, calls + nc / n, max(cum, ct * 1e6 / n))
        per[label] = rows
    labels = list(stats_by_rev)
    heaviest: dict[str, float] = collections.defaultdict(float)
    for rows in per.values():
        for k, (own, _, _) in rows.items():
            heaviest[k] = max(heaviest[k], own)
    keys = sorted(heaviest, key=lambda k: -heaviest[k])[:top]
    head = " | ".join(f"{lab}: own µs | calls | cum µs" for lab in labels)
    lines = [f"| function | {head} |", "|---|" + "---:|---:|---:|" * len(labels)]
    for k in keys:
        cells = []
        for lab in labels:
            own, calls, cum = per[lab].get(k, (0.0, 0.0, 0.0))
            cells += [f"{own:.2f}", f"{calls:.2f}", f"{cum:.1f}"]
        lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
    totals = []
    for lab in labels:
        calls = sum(c for _, c, _ in per[lab].values())
        own = sum(o for o, _, _ in per[lab].values())
        totals += [f"{own:.1f}", f"{calls:.1f}", ""]
    lines.append("| **all functions** | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--inner"]:
        inner(argv[1:])
        return 0
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_worker",
        description="Worker CPU per task, garbage collections and a cProfile, per revision.",
    )
    p.add_argument("revs", nargs="+", metavar="REV", help="commits, branches or working trees")
    p.add_argument("--n", type=int, default=20_000, help="tasks drained per run (20000)")
    p.add_argument("--runs", type=int, default=2, help="plain runs per revision (2)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds after the last task")
    p.add_argument("--top", type=int, default=40, help="functions in the profile table (40)")
    p.add_argument("--no-profile", action="store_true", help="plain runs only")
    p.add_argument("--cycles", action="store_true", help="also a run with gc.DEBUG_SAVEALL")
    p.add_argument(
        "--freeze",
        action="store_true",
        help="an experiment: gc.freeze() when the first task starts (start-up objects"
        " leave the collector's passes); not what the worker does",
    )
    p.add_argument("--cache", action="store_true", help="as benchmarks.ab --cache")
    p.add_argument("--pstats", type=Path, help="keep each revision's profile in this directory")
    p.add_argument("--redis-url", help="use this Redis (ITS DATABASE IS FLUSHED)")
    args = p.parse_args(argv)
    revs = [ab.resolve(r) for r in args.revs]
    with tempfile.TemporaryDirectory(prefix="asyncq-profile-") as tmp:
        work = Path(tmp)
        pins = ab.pinned_requirements()
        for rev in revs:
            ab.build(rev, pins, work, cache=args.cache)
        root = ab.harness(work)
        plain: dict[str, list[dict[str, Any]]] = {r.label: [] for r in revs}
        extra: dict[str, dict[str, Any]] = {}
        stats: dict[str, pstats.Stats] = {}
        with runner.redis_server(args.redis_url, unix_socket=False) as url:
            for k in range(args.runs):
                for rev in revs:
                    ab.log(f"plain run {k + 1}/{args.runs}: {rev.label}")
                    plain[rev.label].append(_run_inner(rev, root, url, args, mode="plain"))
            for i, rev in enumerate(revs):
                if not args.no_profile:
                    name = f"{i + 1}-{rev.commit[:7] or 'tree'}.pstats"
                    out = str((args.pstats or work) / name)
                    if args.pstats:
                        args.pstats.mkdir(parents=True, exist_ok=True)
                    extra[f"{rev.label} cprofile"] = _run_inner(
                        rev, root, url, args, mode="cprofile", out=out
                    )
                    stats[rev.label] = pstats.Stats(out)
                if args.cycles:
                    extra[f"{rev.label} cycles"] = _run_inner(rev, root, url, args, mode="cycles")
    print(f"worker profile, N = {args.n}, {args.runs} plain run(s) per revision, alternating")
    print()
    print("| revision | worker CPU µs / task | start-up CPU ms | after it, µs / task | tasks/s"
          " | gc collections / 1,000 tasks (gen 0, 1, 2) | objects freed by gc / task"
          " | gc CPU µs / task (gen 0, 1, 2) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, recs in plain.items():
        for rec in recs:
            print(
                f"| {label} | {rec['worker_cpu_us_per_task']:.1f} | {rec['startup_cpu_ms']:.0f} |"
                f" {rec['after_startup_us_per_task']:.1f} | {rec['tasks_per_s']:,.0f} |"
                f" {', '.join(str(c) for c in rec['gc_collections_per_1000'])} |"
                f" {rec['gc_collected_per_task']:.2f} | {rec['gc_us_per_task']:.1f}"
                f" ({', '.join(f'{x:.1f}' for x in rec['gc_us_per_task_by_generation'])}) |"
            )
    if stats:
        print()
        print("cProfile (one run each; per task; own = time in the function itself):")
        print()
        print(profile_table(stats, args.n, args.top))
        for label in stats:
            rec = extra[f"{label} cprofile"]
            print(f"- {label} under cProfile: {rec['worker_cpu_us_per_task']:.1f} µs CPU/task")
    for key, rec in extra.items():
        if key.endswith(" cycles"):
            print()
            print(f"{key}: {rec['garbage_total_per_task']} unreachable objects per task;"
                  " per 1,000 tasks by type:")  # fmt: skip
            for kind, count in rec["garbage_per_1000"].items():
                print(f"    {kind}: {count}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
