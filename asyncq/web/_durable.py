"""The durable run pages and their JSON API: the list of runs (a page at a time), a run's
entries and what it waits for, cancelling it, and sending a signal to a queue's runs."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import asyncq.web._render as r
from asyncq._inspection.durable_runs import run_json, summary_json
from asyncq.web._api import MAX_PAGE_SIZE, _inspector, _int, _json
from asyncq.web._pages import render
from asyncq.web._state import state

__all__ = ["durable_routes"]

_SIGNAL_BODY = 'the request body must be the JSON object {"name": ..., "key": ..., "payload": ...}'


async def get_run(request: Request) -> Response:
    _, insp = _inspector(request)
    p = request.path_params
    return _json(run_json(await insp.get_durable_run(p["queue"], p["run_id"])))


async def cancel_run(request: Request) -> Response:
    _, insp = _inspector(request)
    p = request.path_params
    before = await insp.cancel_durable_run(p["queue"], p["run_id"])
    changed = before in ("pending", "running", "waiting")
    message = (
        "Run cancelled" + (": its attempt is being stopped" if before == "running" else "")
        if changed
        else f"The run was already {before}; nothing changed"
    )
    return _json({"ok": True, "previous_state": before, "message": message})


async def send_signal(request: Request) -> Response:
    _, insp = _inspector(request)
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # 3.11 cannot parse ~1,000 levels; 3.12+ can
        raise ValueError(_SIGNAL_BODY) from None
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise ValueError(_SIGNAL_BODY)
    key = body.get("key", "")
    if not isinstance(key, str):
        raise ValueError("the signal's key must be a string")
    name: str = body["name"]
    took = await insp.signal(
        request.path_params["queue"], name, key=key, payload=body.get("payload")
    )
    message = (
        f"Signal taken by {took} run{'s' if took != 1 else ''}"
        if took
        else "No run waits for this signal: kept for the first that does"
    )
    return _json({"ok": True, "took": took, "message": message})


async def run_page(request: Request) -> Response:
    _, insp = _inspector(request)
    p = request.path_params
    info = await insp.get_durable_run(p["queue"], p["run_id"])
    wait = info.waiting_for
    return render(
        request,
        "durable_run.html",
        {
            "run": info,
            "results": [None if e.result is None else r.body(e.result) for e in info.entries],
            "signal_name": (wait.signal_name or "") if wait is not None else "",
            "signal_key": (wait.signal_key or "") if wait is not None else "",
            "nav": "durable",
        },
    )


async def list_runs(request: Request) -> Response:
    _, insp = _inspector(request)
    size = _int(request, "size", state(request).page_size, hi=MAX_PAGE_SIZE)
    page = await insp.durable_runs(
        request.query_params.get("queue") or None,
        limit=size,
        cursor=request.query_params.get("cursor") or None,
    )
    return _json({"runs": [summary_json(s) for s in page.runs], "cursor": page.cursor})


async def runs_page(request: Request) -> Response:
    _, insp = _inspector(request)
    size = _int(request, "size", state(request).page_size, hi=MAX_PAGE_SIZE)
    queue = request.query_params.get("queue") or None
    page = await insp.durable_runs(
        queue, limit=size, cursor=request.query_params.get("cursor") or None
    )
    context: dict[str, Any] = {
        "page": page,
        "queue": queue,
        "size": size,
        "queues": await insp.queues(),
        "first": not request.query_params.get("cursor"),
        "nav": "durable",
    }
    return render(request, "durable_runs.html", context)


def durable_routes() -> list[Route]:
    return [
        Route("/durable", runs_page),
        Route("/api/durable", list_runs),
        Route("/queues/{queue}/durable/{run_id}", run_page),
        Route("/api/queues/{queue}/durable/{run_id}", get_run),
        Route("/api/queues/{queue}/durable/{run_id}/cancel", cancel_run, methods=["POST"]),
        Route("/api/queues/{queue}/signal", send_signal, methods=["POST"]),
    ]
