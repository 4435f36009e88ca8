"""The dashboard's live samples (asyncq.web._live): spacing, age limit, what the page gets."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from asyncq import QueueInfo
from asyncq.web._live import KEEP_SECONDS, LiveSamples


def info(queue: str, **counts: int) -> QueueInfo:
    base = QueueInfo(
        queue=queue, memory_usage=0, latency=timedelta(0), size=0, groups=0, pending=0,
        active=0, scheduled=0, retry=0, archived=0, completed=0, aggregating=0, processed=0,
        failed=0, processed_total=0, failed_total=0, paused=False, timestamp=datetime.now(UTC),
    )  # fmt: skip
    return replace(base, **counts)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def test_samples_sum_the_queues_once_a_second_and_age_out() -> None:
    clock = Clock()
    live = LiveSamples(clock)
    a = info("a", pending=3, archived=2, processed_total=100, failed_total=7)
    b = info("b", pending=1, active=4, completed=5, processed_total=10)
    live.record([a, b])
    clock.t += 0.5
    live.record([replace(a, pending=99)])  # within the spacing: not kept
    clock.t += 0.5
    live.record([replace(a, pending=4), b])
    data = live.as_json()
    assert data["now"] == clock.t
    assert data["states"] == (
        "active", "pending", "aggregating", "scheduled", "retry", "archived", "completed",
    )  # fmt: skip
    assert data["samples"] == [
        [1_000_000.0, 110, 7, 4, 4, 0, 0, 0, 2, 5],
        [1_000_001.0, 110, 7, 4, 5, 0, 0, 0, 2, 5],
    ]
    clock.t += KEEP_SECONDS + 0.5
    live.record([])
    assert live.as_json()["samples"] == [[clock.t, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
