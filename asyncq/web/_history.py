"""The Metrics page and its JSON API: the workers' metrics history per task type.

The page shows, over a window (1 h, 6 h or 24 h), the runs of every task type per
step (throughput and failures) and its p50/p95/p99 run times, charted by
``static/history.js`` from the JSON the page carries (no request of its own, so it
works offline); ``/api/history`` returns the same JSON, which the dashboard reads to
start its throughput chart from the last hour. Prometheus text stays at ``/metrics``.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from asyncq.history import TypeMetrics
from asyncq.web._api import _inspector, _int, _json
from asyncq.web._pages import render

__all__ = ["WINDOWS", "history_json", "history_routes"]

WINDOWS = {60: 1, 360: 5, 1440: 15}
"""The windows offered (minutes) and the step of their series (minutes)."""
CHARTED = 12
"""Task types charted one by one on the page (the most processed; the table lists all)."""


def _window(request: Request) -> int:
    window = _int(request, "window", 60)
    if window not in WINDOWS:
        raise ValueError(f"query parameter 'window' must be one of {sorted(WINDOWS)}, got {window}")
    return window


def _type_dict(m: TypeMetrics, *, series: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "queue": m.queue,
        "task_type": m.task_type,
        "processed": m.processed,
        "failed": m.failed,
        "retried": m.retried,
        "archived": m.archived,
        "failure_rate": m.failure_rate,
        "mean": m.mean,
        "p50": m.p50,
        "p95": m.p95,
        "p99": m.p99,
    }
    if series:
        out["series"] = {
            "processed": [p.processed for p in m.points],
            "failed": [p.failed for p in m.points],
            "p50": [p.p50 for p in m.points],
            "p95": [p.p95 for p in m.points],
            "p99": [p.p99 for p in m.points],
        }
    return out


def history_json(rows: list[TypeMetrics], *, window: int, now: float) -> dict[str, Any]:
    """The page's and the API's JSON: per type its totals and series (the most processed
    :data:`CHARTED` types), and the series of all types together; times in unix seconds,
    run times in seconds."""
    step = WINDOWS[window]
    ranked = sorted(rows, key=lambda m: (-m.processed, m.queue, m.task_type))
    starts = [int(p.start.timestamp()) for p in ranked[0].points] if ranked else []
    processed = [0] * len(starts)
    failed = [0] * len(starts)
    for m in rows:
        for i, p in enumerate(m.points):
            processed[i] += p.processed
            failed[i] += p.failed
    return {
        "now": round(now, 3),
        "window": window,
        "step": step * 60,
        "t": starts,
        "total": {"processed": processed, "failed": failed},
        "types": [_type_dict(m, series=i < CHARTED) for i, m in enumerate(ranked)],
    }


async def _read(request: Request) -> tuple[dict[str, Any], int, list[str], str | None]:
    _, insp = _inspector(request)
    window = _window(request)
    queue = request.query_params.get("queue") or None
    rows = await insp.metrics_history(
        queue,
        window=timedelta(minutes=window),
        step=timedelta(minutes=WINDOWS[window]),
    )
    data = history_json(rows, window=window, now=time.time())
    return data, window, await insp.queues(), queue


async def api_history(request: Request) -> Response:
    data, *_ = await _read(request)
    return _json(data)


async def history_page(request: Request) -> Response:
    data, window, queues, queue = await _read(request)
    return render(
        request,
        "history.html",
        {
            "data": data,
            "window": window,
            "windows": WINDOWS,
            "all_queues": queues,
            "queue_filter": queue,
            "nav": "metrics",
        },
    )


def history_routes() -> list[Route]:
    return [Route("/history", history_page), Route("/api/history", api_history)]
