"""The physical reference for pickup latency: one Pub/Sub hop between two processes.

    python -m benchmarks.pubsub_probe --url redis://127.0.0.1:6379/0 [--n 200]
        [--interval-ms 10] [--warmup 10]

A subscriber process (a blocking socket, no event loop) SUBSCRIBEs to a channel and
stamps each message with ``time.time()`` as it arrives; this process PUBLISHes on the
same cadence as the systems' latency phase (*warmup* messages, 0.5 s of nothing, then
*n* messages *interval* apart), stamping ``time.time()`` just before each PUBLISH.
The latency of a message is arrival − stamp: what an idle process pays, on this
machine, to hear from another through Redis. A task queue's pickup cannot beat it,
since an enqueue reaches an idle worker through at least this one hop. One JSON line
out: ``{"phase": "latency", "n": ..., "p50_ms": ..., "p99_ms": ...}``. Standard
library only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence

from benchmarks.systems._common import Resp, percentile

__all__ = ["probe"]

_IDLE = 0.5  # seconds of nothing before the measured messages, as the latency phase


def _subscribe(url: str, channel: str) -> None:
    """The subscriber process: ``ready``, then ``<payload> <arrival>`` per message."""
    resp = Resp(url)
    resp.sock.sendall(resp._encode(["SUBSCRIBE", channel]))
    resp._read()  # the confirmation
    print("ready", flush=True)
    while True:
        reply = resp._read()
        arrived = time.time()
        if not isinstance(reply, list) or reply[0] != b"message":
            continue
        payload = reply[2].decode()
        if payload == "stop":
            break
        print(f"{payload} {arrived!r}", flush=True)
    resp.close()


def probe(url: str, n: int, interval_ms: float, warmup: int) -> dict[str, str | float | int]:
    """Publish *warmup* + *n* messages to a subscriber process; the latency record."""
    channel = f"pubsub-probe:{uuid.uuid4()}"
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.pubsub_probe", "--subscribe", url, channel],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the subscriber process did not start")
        resp = Resp(url)
        interval = interval_ms / 1000
        for i in range(warmup):
            resp.call("PUBLISH", channel, f"w{i}")
            time.sleep(interval)
        time.sleep(_IDLE)
        sent: dict[str, float] = {}
        tick = time.perf_counter()
        for i in range(n):
            sent[str(i)] = time.time()
            resp.call("PUBLISH", channel, str(i))
            tick += interval
            time.sleep(max(0.0, tick - time.perf_counter()))
        resp.call("PUBLISH", channel, "stop")
        resp.close()
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    arrived = dict(line.split() for line in out.splitlines() if line.strip())
    lat = sorted((float(arrived[k]) - t) * 1000 for k, t in sent.items() if k in arrived)
    return {
        "phase": "latency",
        "n": n,
        "interval_ms": interval_ms,
        "samples": len(lat),
        "p50_ms": round(percentile(lat, 50), 4),
        "p99_ms": round(percentile(lat, 99), 4),
        "command": "python -m benchmarks.pubsub_probe (PUBLISH → SUBSCRIBE, two processes)",
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--interval-ms", type=float, default=10.0)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--subscribe", nargs=2, metavar=("URL", "CHANNEL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.subscribe:
        _subscribe(*args.subscribe)
        return
    print(json.dumps(probe(args.url, args.n, args.interval_ms, args.warmup)))


if __name__ == "__main__":
    main()
