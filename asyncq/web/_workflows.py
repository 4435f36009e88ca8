"""The workflow pages and their JSON API: the list of workflows (a page at a time), a
workflow's stages and steps, and cancelling it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import asyncq.web._render as r
from asyncq import WorkflowInfo
from asyncq._inspection.records import WorkflowPage, WorkflowSummary
from asyncq.web._api import MAX_PAGE_SIZE, _inspector, _int, _json
from asyncq.web._pages import render
from asyncq.web._state import state

__all__ = ["workflow_routes"]


def _when(ts: int | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def workflow_json(info: WorkflowInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "queue": info.queue,
        "state": info.state,
        "stage": info.stage,
        "on_failure": info.policy,
        "created": _when(info.created),
        "finished": _when(info.finished),
        "retention_seconds": int(info.retention.total_seconds()),
        "stages": [
            [
                {
                    "id": s.id,
                    "queue": s.queue,
                    "type": s.type,
                    "state": s.state,
                    "error": s.error,
                    "result_bytes": None if s.result is None else len(s.result),
                }
                for s in stage
            ]
            for stage in info.stages
        ],
    }


async def get_workflow(request: Request) -> Response:
    _, insp = _inspector(request)
    p = request.path_params
    return _json(workflow_json(await insp.get_workflow(p["queue"], p["workflow_id"])))


async def cancel_workflow(request: Request) -> Response:
    _, insp = _inspector(request)
    p = request.path_params
    before = await insp.cancel_workflow(p["queue"], p["workflow_id"])
    return _json({"ok": True, "previous_state": before})


async def workflow_page(request: Request) -> Response:
    _, insp = _inspector(request)
    p = request.path_params
    info = await insp.get_workflow(p["queue"], p["workflow_id"])
    fin = info.finished
    return render(
        request,
        "workflow.html",
        {
            "wf": info,
            "created": datetime.fromtimestamp(info.created, UTC),
            "finished": None if fin is None else datetime.fromtimestamp(fin, UTC),
            "results": [
                [None if s.result is None else r.body(s.result) for s in stage]
                for stage in info.stages
            ],
            "nav": "workflow",
        },
    )


def summary_json(w: WorkflowSummary) -> dict[str, Any]:
    return {
        "id": w.id,
        "queue": w.queue,
        "kind": w.kind,
        "state": w.state,
        "steps_done": w.steps_done,
        "steps_total": w.steps_total,
        "created": w.created.isoformat(),
        "finished": None if w.finished is None else w.finished.isoformat(),
    }


async def _page(request: Request, size: int) -> tuple[str | None, WorkflowPage]:
    _, insp = _inspector(request)
    queue = request.query_params.get("queue") or None
    cursor = request.query_params.get("cursor") or None
    return queue, await insp.workflows(queue, limit=size, cursor=cursor)


async def list_workflows(request: Request) -> Response:
    size = _int(request, "size", state(request).page_size, hi=MAX_PAGE_SIZE)
    _, page = await _page(request, size)
    return _json({"workflows": [summary_json(w) for w in page.workflows], "cursor": page.cursor})


async def workflows_page(request: Request) -> Response:
    size = _int(request, "size", state(request).page_size, hi=MAX_PAGE_SIZE)
    queue, page = await _page(request, size)
    _, insp = _inspector(request)
    return render(
        request,
        "workflows.html",
        {
            "page": page,
            "queue": queue,
            "size": size,
            "queues": await insp.queues(),
            "first": not request.query_params.get("cursor"),
            "nav": "workflows",
        },
    )


def workflow_routes() -> list[Route]:
    return [
        Route("/workflows", workflows_page),
        Route("/api/workflows", list_workflows),
        Route("/queues/{queue}/workflows/{workflow_id}", workflow_page),
        Route("/api/queues/{queue}/workflows/{workflow_id}", get_workflow),
        Route(
            "/api/queues/{queue}/workflows/{workflow_id}/cancel", cancel_workflow, methods=["POST"]
        ),
    ]
