"""A plain redis-py asyncio ``SET``, one awaited at a time, and the event loop's floor.

``python -m benchmarks.redispy_set --url redis://... [--n 5000]`` prints one JSON line:
rate, this process's CPU per call (``getrusage``) and per-call latency p50/p99. A serial
``await client.enqueue()`` does at least this much (one command, one round trip, through
the same redis-py), so its client CPU over this one's says what asyncq adds on top of
the library it is built on. :mod:`benchmarks.ab` runs it in every round as a physical
row, in the environment of the first revision (the same redis-py and event loop as
both revisions: their dependencies are pinned to the same versions).

The same line has the event loop's floor (``floor_cpu_us_per_call``): the same
``SET``, already packed, written on a bare :class:`asyncio.Protocol` whose
``data_received`` resolves one future, awaited one at a time. No asyncio client can
spend less per awaited round trip on this machine (one write, one wait in epoll, one
read, one task wake-up), so an asyncq ratio to redis-py is read against the floor's.

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
        floor = await _floor(client.connection_pool.connection_kwargs, n)
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
        "floor_cpu_us_per_call": round(floor * 1e6 / n, 3),
    }


class _Bare(asyncio.Protocol):
    """A socket whose every read resolves the one future waiting (a reply is one read:
    a 5-byte ``+OK``)."""

    def __init__(self) -> None:
        self.waiter: asyncio.Future[bytes] | None = None

    def data_received(self, data: bytes) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(data)


async def _floor(kwargs: dict[str, Any], n: int) -> float:
    """CPU seconds of *n* serial ``SET`` round trips on a bare protocol (see above), to
    the server and database of redis-py's connection *kwargs*."""
    import hiredis  # redis[hiredis], as redis-py here

    if "path" in kwargs or kwargs.get("ssl"):
        raise SystemExit("the floor is measured over plain TCP: give a redis:// URL")
    setup: list[tuple[Any, ...]] = []
    if kwargs.get("password"):
        user = kwargs.get("username")
        setup.append(("AUTH", user, kwargs["password"]) if user else ("AUTH", kwargs["password"]))
    if kwargs.get("db"):
        setup.append(("SELECT", kwargs["db"]))
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_connection(_Bare, kwargs["host"], kwargs["port"])
    command = hiredis.pack_command(("SET", KEY, b"xxx"))
    try:
        for args in setup:
            proto.waiter = loop.create_future()
            transport.write(hiredis.pack_command(args))
            if await proto.waiter != b"+OK\r\n":
                raise SystemExit(f"the floor's connection could not {args[0]}")
        for count in (100, n):  # the first 100 are not timed, as for redis-py
            cpu0 = _cpu()
            for _ in range(count):
                proto.waiter = loop.create_future()
                transport.write(command)
                if await proto.waiter != b"+OK\r\n":
                    raise SystemExit("the floor's SET got an unexpected reply")
            cpu = _cpu() - cpu0
    finally:
        transport.close()
    return cpu


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
