"""The failure triage page and its JSON API: failed tasks grouped by error signature."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from asyncq import ErrorGroup, ErrorReport, Inspector
from asyncq._time import iso
from asyncq.web._api import _inspector, _int, _json
from asyncq.web._errors import error_body
from asyncq.web._pages import render

__all__ = ["PAGE_LIMIT", "triage_routes"]

PAGE_LIMIT = 5_000
"""Failed tasks the page reads by default (newest first); ``?limit=`` raises it."""
MAX_LIMIT = 200_000
_STATES = ("retry", "archived")
_ACTIONS = ("run", "archive", "delete")


def _filters(request: Request) -> tuple[list[str] | None, tuple[str, ...]]:
    queues = [q for q in request.query_params.getlist("queue") if q] or None
    states = tuple(s for s in request.query_params.getlist("state") if s) or _STATES
    for s in states:
        if s not in _STATES:
            raise ValueError(f"unknown state {s!r} for error groups (expected retry or archived)")
    return queues, states


def filter_qs(queues: list[str], states: list[str], limit: int | None = None) -> str:
    """The query string of the page's filters (states only when not both)."""
    params: list[tuple[str, str | int]] = [("queue", q) for q in queues]
    if len(states) == 1:
        params.append(("state", states[0]))
    if limit is not None:
        params.append(("limit", limit))
    return urlencode(params)


def group_dict(g: ErrorGroup) -> dict[str, Any]:
    return {
        "key": g.key,
        "kind": g.kind,
        "message": g.message,
        "signature": g.signature,
        "example": g.example,
        "count": g.count,
        "first_seen": iso(g.first_seen),
        "last_seen": iso(g.last_seen),
        "task_types": g.task_types,
        "queues": g.queues,
        "states": g.states,
        "sample": [{"queue": q, "id": i} for q, i in g.sample],
    }


def report_dict(report: ErrorReport) -> dict[str, Any]:
    return {
        "scanned": report.scanned,
        "total": report.total,
        "capped": report.capped,
        "groups": [group_dict(g) for g in report.groups],
    }


async def _report(request: Request, insp: Inspector) -> tuple[ErrorReport, int]:
    queues, states = _filters(request)
    limit = _int(request, "limit", PAGE_LIMIT, hi=MAX_LIMIT)
    return await insp.error_groups(queues, states=states, limit=limit), limit


async def api_errors(request: Request) -> Response:
    _, insp = _inspector(request)
    report, _ = await _report(request, insp)
    return _json(report_dict(report))


async def api_error_action(request: Request) -> Response:
    _, insp = _inspector(request)
    key = request.path_params["key"]
    action = request.path_params["action"]
    if action not in _ACTIONS:
        return _json(error_body(404, f"unknown action {action!r} (run, archive, delete)"), 404)
    queues, states = _filters(request)
    if action == "run":
        result = await insp.run_error_group(key, queues=queues, states=states)
    elif action == "archive":
        result = await insp.archive_error_group(key, queues=queues, states=states)
    else:
        result = await insp.delete_error_group(key, queues=queues, states=states)
    return _json({"count": result.acted, "acted": result.acted, "skipped": result.skipped})


async def errors_page(request: Request) -> Response:
    _, insp = _inspector(request)
    report, limit = await _report(request, insp)
    queues, states = _filters(request)
    largest = max((g.count for g in report.groups), default=0)
    return render(
        request,
        "triage.html",
        {
            "report": report,
            "limit": limit,
            "more": min(MAX_LIMIT, report.total, limit * 10),
            "largest": largest,
            "all_queues": await insp.queues(),
            "queue_filter": queues or [],
            "state_filter": list(states),
            "filter_qs": filter_qs,
            "now": datetime.now(UTC),
            "nav": "errors",
        },
    )


def triage_routes() -> list[Route]:
    return [
        Route("/errors", errors_page),
        Route("/api/errors", api_errors),
        Route("/api/errors/{key}/{action}", api_error_action, methods=["POST"]),
    ]
