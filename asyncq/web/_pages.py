"""Server-rendered HTML pages (Jinja2); live parts refresh by short polling."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

import asyncq.web._render as r
from asyncq import QueueNotFoundError, SkippedQueue, TaskState
from asyncq._duration import format_short
from asyncq._http import quote_segment
from asyncq._inspection.records import ARCHIVE_LIMIT, WorkerInfo
from asyncq._redis.scripts import parse_server_version
from asyncq._time import iso
from asyncq.web._api import MAX_PAGE_SIZE, _int, _state_param, queue_infos, task_page
from asyncq.web._state import state

__all__ = ["STATE_ORDER", "page_routes", "templates"]

STATE_ORDER = (
    TaskState.ACTIVE,
    TaskState.PENDING,
    TaskState.AGGREGATING,
    TaskState.SCHEDULED,
    TaskState.RETRY,
    TaskState.ARCHIVED,
    TaskState.COMPLETED,
)
# Per-row and bulk actions each state allows (asynq's rules).
ROW_ACTIONS: dict[TaskState, tuple[str, ...]] = {
    TaskState.ACTIVE: ("cancel", "stop"),
    TaskState.PENDING: ("archive", "delete"),
    TaskState.AGGREGATING: ("run", "archive", "delete"),
    TaskState.SCHEDULED: ("run", "archive", "delete"),
    TaskState.RETRY: ("run", "archive", "delete"),
    TaskState.ARCHIVED: ("run", "delete"),
    TaskState.COMPLETED: ("delete",),
}
BULK_ACTIONS: dict[TaskState, tuple[str, ...]] = {
    TaskState.ACTIVE: ("cancel_all", "stop_all"),
    TaskState.PENDING: ("archive_all", "delete_all"),
    TaskState.AGGREGATING: ("run_all", "archive_all", "delete_all"),
    TaskState.SCHEDULED: ("run_all", "archive_all", "delete_all"),
    TaskState.RETRY: ("run_all", "archive_all", "delete_all"),
    TaskState.ARCHIVED: ("run_all", "delete_all"),
    TaskState.COMPLETED: ("delete_all",),
}

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def short_id(task_id: str) -> str:
    """A task id as a table shows it: a uuid's first 8 characters, any other id whole.

    Custom ids (``order-1071``) often share a prefix, so cutting them would make
    rows read alike; uuids differ from the first character. The whole id is
    always in the cell's ``title`` and its link.
    """
    return task_id[:8] if _UUID.fullmatch(task_id) else task_id


templates.env.filters["bytes"] = _bytes
# What the two cancellations of an active task do, on their buttons.
templates.env.filters["action_title"] = lambda action: {
    "cancel": "Cancel the running handler; the task is retried (as in asynq)",
    "stop": "Cancel the running handler for good: the task is archived, not retried",
}.get(action.removesuffix("_all"), "")
templates.env.filters["shortid"] = short_id
templates.env.filters["dur"] = format_short
templates.env.filters["iso"] = iso
templates.env.filters["stamp"] = r.stamp
# Every path segment a page builds (queue names and task ids may hold "/" or be "..").
templates.env.filters["seg"] = quote_segment
templates.env.globals["body"] = r.body
templates.env.globals["fromts"] = lambda ts: datetime.fromtimestamp(int(ts), UTC)


def render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    st = state(request)
    ctx = {
        "request": request,
        "base": request.scope.get("root_path", "").rstrip("/"),
        "now": datetime.now(UTC),
        "relative": r.relative,
        **st.template_globals(),
        **context,
    }
    return templates.TemplateResponse(request, name, ctx, status_code=status)


async def dashboard(request: Request) -> Response:
    st = state(request)
    insp = st.inspector()
    unreadable: list[SkippedQueue] = []
    infos = sorted(await queue_infos(insp, unreadable), key=lambda i: i.queue)
    st.live.record(infos)
    biggest = max((i.size for i in infos), default=0)
    totals = {s.value: sum(getattr(i, s.value) for i in infos) for s in STATE_ORDER}
    return render(
        request,
        "dashboard.html",
        {
            "queues": infos,
            "biggest": biggest,
            "totals": totals,
            "states": STATE_ORDER,
            "skipped": (*insp.skipped_queues, *unreadable),
            "nav": "queues",
            "live": st.live.as_json(),
        },
    )


async def queue_page(request: Request) -> Response:
    st = state(request)
    insp = st.inspector()
    queue = request.path_params["queue"]
    state_ = _state_param(request.query_params.get("state"))
    page = _int(request, "page", 1)
    size = _int(request, "size", st.page_size, hi=MAX_PAGE_SIZE)
    group = request.query_params.get("group") or None
    data = await task_page(insp, queue, state_, page=page, size=size, group=group)
    rows = [(t, r.body(t.payload), r.body(t.result) if t.result else None) for t in data["tasks"]]
    # An active task's start and deadline live in the record of the worker running it
    # (asynq's ListActiveTasks reads them there too); one read of the live servers.
    workers: dict[str, WorkerInfo] = {}
    if state_.value == "active" and rows:
        workers = {
            w.task_id: w for s in await insp.servers() for w in s.active_workers if w.queue == queue
        }
    return render(
        request,
        "queue.html",
        {
            **data,
            "workers": workers,
            "queue": queue,
            "queues": await insp.queues(),
            "rows": rows,
            "states": STATE_ORDER,
            "row_actions": ROW_ACTIONS[state_],
            "bulk_actions": BULK_ACTIONS[state_],
            "limit": st.max_payload_length,
            "archive_limit": ARCHIVE_LIMIT,
            "nav": "queues",
            "page": page,
        },
    )


async def task_detail(request: Request) -> Response:
    insp = state(request).inspector()
    task = await insp.get_task(request.path_params["queue"], request.path_params["task_id"])
    now = datetime.now(UTC)
    actions = ROW_ACTIONS[task.state]
    started = None
    if task.state is TaskState.ACTIVE:  # the worker running it records when it started
        started = next(
            (
                w.started
                for s in await insp.servers()
                for w in s.active_workers
                if w.task_id == task.id and w.queue == task.queue
            ),
            None,
        )
    return render(
        request,
        "task.html",
        {
            "task": task,
            "payload": r.body(task.payload),
            "result": r.body(task.result) if task.result is not None else None,
            "timeline": r.task_timeline(task, now, started=started),
            "actions": actions,
            "nav": "task",
        },
    )


async def servers_page(request: Request) -> Response:
    insp = state(request).inspector()
    context = {
        "servers": await insp.servers(),
        "type_rates": await insp.type_rates(),
        "nav": "servers",
    }
    return render(request, "servers.html", context)


async def schedulers_page(request: Request) -> Response:
    st = state(request)
    insp = st.inspector()
    entries = await insp.scheduler_entries()
    return render(
        request,
        "schedulers.html",
        {
            "entries": entries,
            "body": r.body,
            "limit": st.max_payload_length,
            "nav": "schedulers",
        },
    )


async def scheduler_history(request: Request) -> Response:
    st = state(request)
    insp = st.inspector()
    entry_id = request.path_params["entry_id"]
    page = _int(request, "page", 1)
    size = _int(request, "size", st.page_size, hi=MAX_PAGE_SIZE)
    events = await insp.scheduler_enqueue_events(entry_id, page=page, size=size)
    entry = next((e for e in await insp.scheduler_entries() if e.id == entry_id), None)
    return render(
        request,
        "scheduler_history.html",
        {
            "entry_id": entry_id,
            "entry": entry,
            "events": events,
            "page_no": page,
            "size": size,
            "nav": "schedulers",
        },
    )


async def redis_page(request: Request) -> Response:
    st = state(request)
    insp = st.inspector()
    info = await insp.redis_info()
    cluster: list[dict[str, Any]] | None = None
    if st.is_cluster():
        cluster = []
        for name in await insp.queues():
            try:
                slot = await insp.cluster_key_slot(name)
                nodes = await insp.cluster_nodes(name)
            except QueueNotFoundError:
                continue
            cluster.append({"queue": name, "slot": slot, "nodes": nodes})
    # The server's own name and version: Valkey's redis_version is a compatibility number.
    server, version = parse_server_version(info) if info else ("Redis", "")
    return render(
        request,
        "redis.html",
        {
            "info": info,
            "server": f"{server} {version or '?'}",
            "cluster": cluster,
            "nav": "redis",
        },
    )


async def search(request: Request) -> Response:
    insp = state(request).inspector()
    task_id = (request.query_params.get("id") or "").strip()
    found = await insp.find_task(task_id) if task_id else []
    base = request.scope.get("root_path", "").rstrip("/")
    if len(found) == 1:
        t = found[0]
        return RedirectResponse(
            f"{base}/queues/{quote_segment(t.queue)}/tasks/{quote_segment(t.id)}", status_code=303
        )
    return render(
        request,
        "search.html",
        {"task_id": task_id, "found": found, "nav": "search"},
        status=200 if found or not task_id else 404,
    )


def page_routes() -> list[Route]:
    return [
        Route("/", dashboard),
        Route("/queues/{queue}", queue_page),
        Route("/queues/{queue}/tasks/{task_id}", task_detail),
        Route("/servers", servers_page),
        Route("/schedulers", schedulers_page),
        Route("/schedulers/{entry_id}", scheduler_history),
        Route("/redis", redis_page),
        Route("/search", search),
    ]
