"""Many queues: asyncq's processing rate, Redis CPU and commands per task by queue count.

``python -m benchmarks.queues`` (or ``nox -s bench -- queues``-style by hand) runs, for
1, 10, 100, 1,000 and 10,000 queues in strict and weighted order, one worker
(concurrency 100) draining N no-op tasks spread evenly over the queues, then
measures the idle worker: Redis commands per second and the pickup latency of
tasks pushed the way Go asynq or redis-cli push them (no wake-up message).

``--before PATH`` runs the same phases against another asyncq checkout (e.g. the
main branch) in the same run, alternating with this one, so both see the same
machine load. Each measurement runs in a fresh subprocess on a throwaway
``redis-server``; ``--cap`` bounds a drain (a run that hits it reports the rate
it reached). Redis figures come from ``INFO``: ``total_commands_processed``
counts the commands scripts run inside Redis too; ``evalsha`` counts script
calls (one round trip each).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent


# --------------------------------------------------------------------------- one measurement


async def _stats(redis: Any) -> tuple[float, int, int]:
    cpu = await redis.info("cpu")
    stats = await redis.info("stats")
    cmd = await redis.info("commandstats")
    evalsha = int(cmd.get("cmdstat_evalsha", {}).get("calls", 0))
    return (
        float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        int(stats["total_commands_processed"]),
        evalsha,
    )


async def measure(
    url: str, *, nqueues: int, mode: str, n: int, cap: float, samples: int
) -> dict[str, Any]:
    import structlog
    from redis.asyncio import Redis

    from asyncq import Client, ServeMux, Server, Task

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    names = [f"bq{i:05d}" for i in range(nqueues)]
    queues = {q: 1 + i % 10 for i, q in enumerate(names)}
    redis = Redis.from_url(url)
    await redis.flushall()
    async with Client(url) as client:
        per_queue: dict[str, list[Any]] = {}
        for i in range(n):
            per_queue.setdefault(names[i % nqueues], []).append(Task("noop", b"%d" % i))
        for q, tasks in per_queue.items():
            for res in await client.enqueue_many(tasks, queue=q):
                if isinstance(res, Exception):
                    raise res
    done = 0
    all_done = asyncio.Event()
    picked: dict[str, float] = {}
    waiting: dict[str, asyncio.Event] = {}
    mux = ServeMux()

    async def noop(task: Any) -> None:
        nonlocal done
        done += 1
        if task.id and task.id.startswith("lat-"):
            picked[task.id] = time.time()
            if task.id in waiting:
                waiting[task.id].set()
        if done >= n:
            all_done.set()

    mux.handle("noop", noop)
    server = Server(url, concurrency=100, queues=queues, strict_priority=mode == "strict")
    cpu0, cmds0, ev0 = await _stats(redis)
    start = time.perf_counter()
    out: dict[str, Any] = {"queues": nqueues, "mode": mode, "n": n}
    async with server:
        await server.start(mux)
        try:
            await asyncio.wait_for(all_done.wait(), cap)
        except TimeoutError:
            out["capped"] = True
        elapsed = time.perf_counter() - start
        cpu1, cmds1, ev1 = await _stats(redis)
        processed = max(done, 1)
        out.update(
            processed=done,
            seconds=round(elapsed, 3),
            tasks_per_s=round(done / elapsed, 1),
            redis_cpu_us_per_task=round((cpu1 - cpu0) * 1e6 / processed, 1),
            commands_per_task=round((cmds1 - cmds0) / processed, 2),
            script_calls_per_task=round((ev1 - ev0) / processed, 3),
        )
        if not out.get("capped"):
            # Idle: let the periodic roles settle, then count over a window.
            await asyncio.sleep(1.0)
            cpu0, cmds0, ev0 = await _stats(redis)
            t0 = time.perf_counter()
            await asyncio.sleep(3.0)
            cpu1, cmds1, ev1 = await _stats(redis)
            window = time.perf_counter() - t0
            out.update(
                idle_script_calls_per_s=round((ev1 - ev0) / window, 1),
                # less the 3 INFO commands of one _stats call
                idle_commands_per_s_in_redis=round((cmds1 - cmds0 - 3) / window, 1),
                idle_redis_cpu_pct=round((cpu1 - cpu0) * 100 / window, 2),
            )
            # Pickup latency of tasks nobody announces (Go asynq, redis-cli).
            from asyncq.proto.asynq import TaskMessage

            lat: list[float] = []
            for k in range(samples):
                q = random.choice(names)
                tid = f"lat-{k}"
                msg = TaskMessage(
                    type="noop", payload=b"0", id=tid, queue=q, retry=25, timeout=1800
                )
                await redis.hset(
                    f"asynq:{{{q}}}:t:{tid}",
                    mapping={
                        "msg": bytes(msg),
                        "state": "pending",
                        "pending_since": time.time_ns(),
                    },
                )
                t_push = time.time()
                await redis.lpush(f"asynq:{{{q}}}:pending", tid)
                arrived = waiting[tid] = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), 5)
                if tid in picked:
                    lat.append((picked[tid] - t_push) * 1000)
                await asyncio.sleep(random.uniform(0.05, 0.25))
            if lat:
                lat.sort()
                out["unannounced_pickup_ms_p50"] = round(statistics.median(lat), 1)
                out["unannounced_pickup_ms_max"] = round(lat[-1], 1)
                out["unannounced_samples"] = len(lat)
        await server.shutdown()
    await redis.aclose()
    return out


# --------------------------------------------------------------------------- orchestration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_redis() -> tuple[subprocess.Popen[bytes], str, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (apt-get install redis-server)")
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="asyncq-bench-queues-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not start") from None
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0", workdir


def _run_one(
    code: Path, url: str, *, nqueues: int, mode: str, n: int, cap: float, samples: int
) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(code))
    cmd = [sys.executable, str(HERE), "--one", "--url", url, "--nqueues", str(nqueues),
           "--mode", mode, "--n", str(n), "--cap", str(cap), "--samples", str(samples)]  # fmt: skip
    # Run from a directory without an asyncq package so PYTHONPATH decides which one loads.
    res = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True,
                         timeout=cap + 120, check=False)  # fmt: skip
    if res.returncode != 0:
        return {"queues": nqueues, "mode": mode, "error": res.stderr.strip().splitlines()[-1:]}
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def _git(code: Path) -> str:
    try:
        git = ["git", "describe", "--always", "--dirty"]
        return subprocess.run(
            git, cwd=code, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(code)


def _table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("code", "code"), ("queues", "queues"), ("mode", "mode"), ("tasks_per_s", "tasks/s"),
        ("redis_cpu_us_per_task", "Redis CPU µs/task"), ("commands_per_task", "commands/task"),
        ("script_calls_per_task", "script calls/task"),
        ("idle_script_calls_per_s", "idle script calls/s"),
        ("idle_commands_per_s_in_redis", "idle commands/s (in Redis)"),
        ("unannounced_pickup_ms_p50", "unannounced pickup p50 ms"),
        ("unannounced_pickup_ms_max", "max ms"),
    ]  # fmt: skip
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for key, _ in cols:
            v = r.get(key, "–")
            if key == "tasks_per_s" and r.get("capped"):
                v = f"{v} (capped)"
            if key == "tasks_per_s" and r.get("error"):
                v = f"error: {r['error']}"
            cells.append(f"{v:,}" if isinstance(v, int | float) and key == "queues" else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", default="")
    p.add_argument("--nqueues", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="weighted", help=argparse.SUPPRESS)
    p.add_argument("--queues", default="1,10,100,1000,10000", help="queue counts to run")
    p.add_argument("--modes", default="strict,weighted")
    p.add_argument("--n", type=int, default=20_000, help="tasks per drain")
    p.add_argument("--cap", type=float, default=120.0, help="longest drain, seconds")
    p.add_argument("--samples", type=int, default=50, help="unannounced pickups measured")
    p.add_argument("--quick", action="store_true", help="n=3000, cap 30 s, 10 samples")
    p.add_argument("--before", type=Path, help="another asyncq checkout to compare, same run")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    if args.one:
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        out = runner(
            measure(
                args.url,
                nqueues=args.nqueues,
                mode=args.mode,
                n=args.n,
                cap=args.cap,
                samples=args.samples,
            )
        )
        print(json.dumps(out))
        return
    if args.quick:
        args.n, args.cap, args.samples = 3000, 30.0, 10
    codes = [("this", ROOT)]
    if args.before is not None:
        codes.append(("before", args.before.resolve()))
    proc, url, workdir = _start_redis()
    rows: list[dict[str, Any]] = []
    try:
        for nq in [int(x) for x in args.queues.split(",")]:
            for mode in args.modes.split(","):
                for label, code in codes:
                    print(
                        f"[queues] {label} {_git(code)}: {nq} queues, {mode} ...",
                        file=sys.stderr,
                        flush=True,
                    )
                    row = _run_one(
                        code, url, nqueues=nq, mode=mode, n=args.n, cap=args.cap,
                        samples=args.samples,
                    )  # fmt: skip
                    row["code"] = f"{label} ({_git(code)})"
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    print(_table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
