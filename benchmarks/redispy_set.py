"""A plain redis-py asyncio ``SET``, one awaited at a time: the Python client's floor.

``python -m benchmarks.redispy_set --url redis://... [--n 5000]`` prints one JSON line:
rate, this process's CPU per call (``getrusage``) and per-call latency p50/p99. A serial
``await client.enqueue()`` does at least this much (one command, one round trip, through
the same redis-py), so its client CPU over this one's says what asyncq adds on top of
the library it is built on. :mod:`benchmarks.ab` runs it in every round as a physical
row, in the environment of the first revision (the same redis-py and event loop as
both revisions: their dependencies are pinned to the same versions).

The key is ``bench:redispy-set`` with a 3-byte value, as ``redis-benchmark -t set``
writes; the driver deletes it afterwards. Runs on uvloop where installed, like the
system scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.systems._common import percentile

KEY = "bench:redispy-set"


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def measure(url: str, n: int) -> dict[str, Any]:
    """*n* serial ``SET`` calls through one ``redis.asyncio.Redis``, after 100 untimed ones."""
    # Imported here: the benchmarks package stays importable with the standard library
    # alone, and this runs in an environment that has redis-py (asyncq's dependency).
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        for _ in range(100):  # the connection made and the first replies parsed: not timed
            await client.set(KEY, b"xxx")
        latencies: list[float] = []
        clock = time.perf_counter
        cpu0 = _cpu()
        t0 = clock()
        for _ in range(n):
            start = clock()
            await client.set(KEY, b"xxx")
            latencies.append(clock() - start)
        seconds = clock() - t0
        cpu = _cpu() - cpu0
        await client.delete(KEY)
    finally:
        await client.aclose()
    latencies.sort()
    return {
        "phase": "redispy_set",
        "n": n,
        "seconds": round(seconds, 6),
        "tasks_per_s": round(n / seconds, 1),
        "client_cpu_us_per_task": round(cpu * 1e6 / n, 3),
        "p50_ms": round(percentile(latencies, 50) * 1e3, 4),
        "p99_ms": round(percentile(latencies, 99) * 1e3, 4),
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.redispy_set", description=__doc__)
    p.add_argument("--url", required=True, help="Redis URL (the key bench:redispy-set is used)")
    p.add_argument("--n", type=int, default=5000, help="timed SET calls (5000)")
    args = p.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        record = asyncio.run(measure(args.url, args.n))
    else:
        record = uvloop.run(measure(args.url, args.n))
    sys.stdout.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
