"""Rate-limit bursts: ``"10/s burst 1"`` starts at most 10 tasks in any one-second window,
fleet-wide; the default burst (the count) allows up to 2N - 1."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

import pytest
from click.testing import CliRunner
from redis.asyncio import Redis

from asyncq import Client, Inspector, Task
from asyncq._broker import Broker
from asyncq._broker.multiqueue import MultiQueue
from asyncq._worker.limits import QueueLimits, parse_rate
from asyncq.cli import main
from tests.support.procs import drain, spawn, stop_process, wait_for_line, wait_until
from tests.support.workers.flow_worker import STAMPS

Q = "limited"
READY = "send signal TERM or INT"


def test_burst_parses_and_reaches_the_fetch() -> None:
    strict = parse_rate("10/s burst 1")
    assert (strict.count, strict.burst, strict.interval_us, str(strict)) == (
        10,
        1,
        100_000,
        "10/s burst 1",
    )
    assert parse_rate("10/s").burst == 10  # the default: the count
    assert str(parse_rate("10/s burst 10")) == "10/s"  # the default spelt out
    assert parse_rate(" 600 / MIN  Burst 50 ").burst == 50
    for bad in ("10/s burst 0", "10/s burst", "10/s burst=1", "10/s burst -1"):
        with pytest.raises(ValueError, match="bad rate"):
            parse_rate(bad)
    limits = QueueLimits({}, {}, {Q: strict, "loose": parse_rate("10/s")})
    assert limits.for_fetch() == {Q: (-1, -1, 100_000, 1), "loose": (-1, -1, 100_000, 10)}
    res = CliRunner().invoke(main, ["worker", "x:y", "--rate-limit", f"{Q}=10/s burst 0"])
    assert res.exit_code == 2 and "burst must be at least 1" in res.output, res.output


async def test_a_burst_of_one_gives_one_task_then_holds(redis: Redis) -> None:
    async with Client(redis) as client:
        await client.enqueue_many([Task("work", b"", queue=Q) for _ in range(5)])
    mq = MultiQueue(Broker(redis))
    limits = QueueLimits({}, {}, {Q: parse_rate("10/min burst 1")}).for_fetch()
    got = await mq.dequeue([Q], 10, limits=limits)
    assert len(got.tasks) == 1 and got.held == {Q}
    assert (await mq.dequeue([Q], 10, limits=limits)).tasks == []
    async with Inspector(redis) as insp:
        info = await insp.queue_info(Q)
    assert (info.rate_limit, info.rate_tokens, info.rate_per_second) == ("10/min burst 1", 0, 1 / 6)


@contextmanager
def monitor(url: str, pattern: re.Pattern[bytes]) -> Iterator[list[int]]:
    """Redis MONITOR in a thread: the server's own µs timestamps of the lines matching
    *pattern*, as the server executed them (script commands included)."""
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379))
    sock.sendall(b"MONITOR\r\n")
    stamps: list[int] = []
    stop = threading.Event()

    def read() -> None:
        buf = b""
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\r\n")
            for line in lines:
                m = pattern.match(line)
                if m:
                    sec, usec = m.group(1).split(b".")
                    stamps.append(int(sec) * 1_000_000 + int(usec))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield stamps
    finally:
        stop.set()
        thread.join(5)
        sock.close()


def most_in_one_second(stamps: list[int]) -> int:
    """The largest number of stamps in any half-open window [t, t + 1 s)."""
    stamps = sorted(stamps)
    most = j = 0
    for i, start in enumerate(stamps):
        while j < len(stamps) and stamps[j] < start + 1_000_000:
            j += 1
        most = max(most, j - i)
    return most


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("rate", "bound"), [("10/s burst 1", 10), ("10/s", 19)])
async def test_three_workers_never_start_more_than_the_burst_allows(
    redis_url: str, redis: Redis, rate: str, bound: int
) -> None:
    n = 45
    # Every task leaves pending in the dequeue script: its RPOPLPUSH, stamped by
    # Redis itself, is the moment the task started as far as the rate is concerned.
    taken = re.compile(rb'^\+(\d+\.\d+) \[\d+ lua\] "RPOPLPUSH" "asynq:\{' + Q.encode() + rb"\}")
    procs = [spawn("flow_worker.py", redis_url, "concurrency=12", f"rate={Q}:{rate}")]
    procs += [spawn("flow_worker.py", redis_url, "concurrency=12", f"rate={Q}:{rate}")]
    procs += [spawn("flow_worker.py", redis_url, "concurrency=12", f"rate={Q}:{rate}")]
    try:
        for proc in procs:
            await wait_for_line(proc, READY)
            drain(proc)  # it logs every task: keep its pipes from filling
        with monitor(redis_url, taken) as starts:
            async with Client(redis) as client:
                await client.enqueue_many([Task("stamp", b"", queue=Q) for _ in range(n)])

            async def done() -> bool:
                return await redis.llen(STAMPS) == n

            await wait_until(done, within=120, interval=0.1, what="rate-limited tasks done")
            await wait_until(lambda: len(starts) == n, within=10, what="every start seen")
        most = most_in_one_second(starts)
        assert most <= bound, (rate, most)
        if rate == "10/s":
            # The default burst really lets more than 10 start in one second (what a
            # partner with a hard "10 in any second" limit would refuse).
            assert most > 10
        else:
            assert most >= 5  # the rate is used, not stalled
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        for proc in procs:
            stop_process(proc)
