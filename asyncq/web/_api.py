"""The JSON API under ``/api/``: everything the pages show and do, through the Inspector."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import structlog
from redis.exceptions import ResponseError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import asyncq.web._render as r
from asyncq import (
    BrokerError,
    FailedPreconditionError,
    Inspector,
    QueueInfo,
    QueueNotFoundError,
    SkippedQueue,
    TaskInfo,
    TaskNotFoundError,
    TaskState,
)
from asyncq.web._errors import error_body
from asyncq.web._state import WebState, state

__all__ = ["api_routes", "history_totals", "queue_infos", "task_page"]

_log = structlog.get_logger("asyncq.web")

_CONCURRENCY = 16
MAX_PAGE_SIZE = 500
BATCH_LIMIT = 1000


def _int(request: Request, name: str, default: int, *, lo: int = 1, hi: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"query parameter {name!r} must be an integer, got {raw!r}") from None
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"query parameter {name!r} must be {bound}, got {value}")
    return value


def _state_param(raw: str | None, default: TaskState = TaskState.PENDING) -> TaskState:
    if raw is None or raw == "":
        return default
    try:
        return TaskState(raw)
    except ValueError:
        valid = ", ".join(s.value for s in TaskState)
        raise ValueError(f"unknown task state {raw!r} (expected one of: {valid})") from None


async def queue_infos(
    inspector: Inspector, unreadable: list[SkippedQueue] | None = None
) -> list[QueueInfo]:
    """Every queue's info, read concurrently (a queue removed meanwhile is skipped).

    A queue whose keys Redis refuses to read (another type than asynq's, a broken
    record) is skipped too, logged and added to *unreadable*, so one damaged queue
    does not take down the summary of every other.
    """
    names = await inspector.queues()
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def one(name: str) -> QueueInfo | None:
        async with limit:
            try:
                return await inspector.queue_info(name)
            except QueueNotFoundError:
                return None
            except (ResponseError, BrokerError) as exc:
                _log.warning("queue skipped: Redis refused to read it", queue=name, error=str(exc))
                if unreadable is not None:
                    unreadable.append(SkippedQueue(name, f"Redis refused to read it: {exc}"))
                return None

    return [i for i in await asyncio.gather(*(one(n) for n in names)) if i is not None]


async def history_totals(inspector: Inspector, days: int) -> list[dict[str, Any]]:
    """Processed/failed per UTC day summed over every queue, oldest day first."""
    names = await inspector.queues()
    limit = asyncio.Semaphore(_CONCURRENCY)
    totals: dict[date, list[int]] = {}

    async def one(name: str) -> None:
        async with limit:
            try:
                rows = await inspector.history(name, days)
            except QueueNotFoundError:
                return
        for row in rows:
            acc = totals.setdefault(row.date, [0, 0])
            acc[0] += row.processed
            acc[1] += row.failed

    await asyncio.gather(*(one(n) for n in names))
    today = datetime.now(UTC).date()
    out = []
    for back in range(days - 1, -1, -1):
        day = today - timedelta(days=back)
        processed, failed = totals.get(day, [0, 0])
        out.append({"date": day.isoformat(), "processed": processed, "failed": failed})
    return out


def _count(info: QueueInfo, st: TaskState, group: str | None, groups: dict[str, int]) -> int:
    if st is TaskState.AGGREGATING:
        return groups.get(group or "", 0)
    return int(getattr(info, st.value))


async def task_page(
    inspector: Inspector,
    queue: str,
    st: TaskState,
    *,
    page: int,
    size: int,
    group: str | None,
) -> dict[str, Any]:
    """One page of a state's tasks with the counts needed to paginate."""
    info = await inspector.queue_info(queue)
    groups = {g.group: g.size for g in await inspector.groups(queue)}
    if st is TaskState.AGGREGATING and group is None and groups:
        group = min(groups)
    total = _count(info, st, group, groups)
    if st is TaskState.AGGREGATING and group is None:
        tasks: list[TaskInfo] = []
    else:
        tasks = await inspector.list_tasks(
            queue, st, page=page, size=size, group=group if st is TaskState.AGGREGATING else None
        )
    return {
        "info": info,
        "groups": groups,
        "group": group,
        "state": st,
        "tasks": tasks,
        "page": page,
        "size": size,
        "total": total,
        "pages": max(1, math.ceil(total / size)),
    }


# -- handlers ----------------------------------------------------------------------------------


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status)


def _inspector(request: Request) -> tuple[WebState, Inspector]:
    st = state(request)
    return st, st.inspector()


async def list_queues(request: Request) -> Response:
    _, insp = _inspector(request)
    unreadable: list[SkippedQueue] = []
    infos = await queue_infos(insp, unreadable)
    skipped = [
        {"name": s.name, "reason": s.reason, "message": s.message}
        for s in (*insp.skipped_queues, *unreadable)
    ]
    return _json({"queues": [r.queue_dict(i) for i in infos], "skipped": skipped})


async def get_queue(request: Request) -> Response:
    _, insp = _inspector(request)
    queue = request.path_params["queue"]
    info = await insp.queue_info(queue)
    days = _int(request, "days", 10, hi=90)
    history = await insp.history(queue, days)
    groups = await insp.groups(queue)
    return _json(
        {
            "queue": r.queue_dict(info),
            "history": [r.daily_dict(d) for d in history],
            "groups": [r.group_dict(g) for g in groups],
        }
    )


async def stats(request: Request) -> Response:
    _, insp = _inspector(request)
    days = _int(request, "days", 7, hi=90)
    return _json({"days": await history_totals(insp, days)})


async def list_groups(request: Request) -> Response:
    _, insp = _inspector(request)
    groups = await insp.groups(request.path_params["queue"])
    return _json({"groups": [r.group_dict(g) for g in groups]})


async def list_tasks(request: Request) -> Response:
    st, insp = _inspector(request)
    state_ = _state_param(request.query_params.get("state"))
    page = _int(request, "page", 1)
    size = _int(request, "size", st.page_size, hi=MAX_PAGE_SIZE)
    group = request.query_params.get("group") or None
    data = await task_page(
        insp, request.path_params["queue"], state_, page=page, size=size, group=group
    )
    return _json(
        {
            "queue": data["info"].queue,
            "state": state_.value,
            "group": data["group"],
            "page": page,
            "size": size,
            "total": data["total"],
            "pages": data["pages"],
            "tasks": [r.task_dict(t, limit=st.max_payload_length) for t in data["tasks"]],
        }
    )


async def get_task(request: Request) -> Response:
    _, insp = _inspector(request)
    task = await insp.get_task(request.path_params["queue"], request.path_params["task_id"])
    return _json({"task": r.task_dict(task)})


async def search_task(request: Request) -> Response:
    _, insp = _inspector(request)
    found = await insp.find_task(request.path_params["task_id"])
    if not found:
        message = f"no task with ID {request.path_params['task_id']!r}"
        return _json(error_body(404, message, code="task_not_found"), 404)
    return _json({"tasks": [r.task_dict(t) for t in found]})


async def servers(request: Request) -> Response:
    _, insp = _inspector(request)
    return _json({"servers": [r.server_dict(s) for s in await insp.servers()]})


async def type_rates(request: Request) -> Response:
    _, insp = _inspector(request)
    return _json({"type_rates": [r.type_rate_dict(t) for t in await insp.type_rates()]})


async def schedulers(request: Request) -> Response:
    st, insp = _inspector(request)
    entries = await insp.scheduler_entries()
    return _json({"entries": [r.scheduler_dict(e, limit=st.max_payload_length) for e in entries]})


async def scheduler_events(request: Request) -> Response:
    st, insp = _inspector(request)
    page = _int(request, "page", 1)
    size = _int(request, "size", st.page_size, hi=MAX_PAGE_SIZE)
    events = await insp.scheduler_enqueue_events(
        request.path_params["entry_id"], page=page, size=size
    )
    return _json({"page": page, "size": size, "events": [r.event_dict(e) for e in events]})


async def redis_info(request: Request) -> Response:
    st, insp = _inspector(request)
    info = await insp.redis_info()
    out: dict[str, Any] = {"address": st.address, "info": info, "cluster": None}
    if st.is_cluster():
        rows = []
        for name in await insp.queues():
            try:
                slot = await insp.cluster_key_slot(name)
                nodes = await insp.cluster_nodes(name)
            except QueueNotFoundError:
                continue
            rows.append(
                {
                    "queue": name,
                    "slot": slot,
                    "nodes": [{"id": n.id, "addr": n.addr} for n in nodes],
                }
            )
        out["cluster"] = rows
    return _json(out, 200)


# -- mutations -----------------------------------------------------------------------------


async def pause(request: Request) -> Response:
    _, insp = _inspector(request)
    await insp.pause(request.path_params["queue"])
    return _json({"ok": True})


async def resume(request: Request) -> Response:
    _, insp = _inspector(request)
    await insp.resume(request.path_params["queue"])
    return _json({"ok": True})


async def delete_queue(request: Request) -> Response:
    _, insp = _inspector(request)
    force = request.query_params.get("force", "") in ("1", "true", "yes")
    await insp.delete_queue(request.path_params["queue"], force=force)
    return _json({"ok": True})


async def task_action(request: Request) -> Response:
    _, insp = _inspector(request)
    queue = request.path_params["queue"]
    task_id = request.path_params["task_id"]
    action = request.path_params["action"]
    if action == "run":
        await insp.run_task(queue, task_id)
    elif action == "archive":
        await insp.archive_task(queue, task_id)
    elif action == "delete":
        await insp.delete_task(queue, task_id)
    elif action in ("cancel", "stop"):
        await _cancel(insp, queue, task_id, retry=action == "cancel")
    else:
        message = f"unknown action {action!r} (run, archive, delete, cancel, stop)"
        return _json(error_body(404, message), 404)
    return _json({"ok": True})


async def delete_task(request: Request) -> Response:
    _, insp = _inspector(request)
    await insp.delete_task(request.path_params["queue"], request.path_params["task_id"])
    return _json({"ok": True})


async def _cancel(insp: Inspector, queue: str, task_id: str, *, retry: bool = True) -> None:
    """Cancel an active task: retried (``cancel``), or archived (``stop``: no retry)."""
    task = await insp.get_task(queue, task_id)  # a clear 404 for an unknown ID
    if task.state is not TaskState.ACTIVE:
        raise FailedPreconditionError(
            f"cannot cancel a task in {task.state.value} state; only active tasks can be canceled"
        )
    await insp.cancel(task_id, retry=retry)


async def _cancel_all(insp: Inspector, queue: str, *, retry: bool = True) -> int:
    ids: list[str] = []
    page = 1
    while True:
        batch = await insp.list_active(queue, page=page, size=100)
        ids += [t.id for t in batch]
        if len(batch) < 100:
            break
        page += 1
    for task_id in ids:
        await insp.cancel(task_id, retry=retry)
    return len(ids)


async def bulk_action(request: Request) -> Response:
    _, insp = _inspector(request)
    queue = request.path_params["queue"]
    st = _state_param(request.path_params["state"])
    action = request.path_params["action"]
    group = request.query_params.get("group") or None
    extra: dict[str, Any] = {}
    if action in ("cancel_all", "stop_all"):
        if st is not TaskState.ACTIVE:
            raise ValueError(f"{action} applies to active tasks only")
        count = await _cancel_all(insp, queue, retry=action == "cancel_all")
    elif action == "run_all":
        count = await insp.run_all(queue, st, group=group)
    elif action == "archive_all":
        report = await insp.archive_all_report(queue, st, group=group)
        count = report.moved
        extra = {"deleted": report.deleted, "message": report.message}
    elif action == "delete_all":
        count = await insp.delete_all(queue, st, group=group)
    else:
        message = (
            f"unknown action {action!r} (run_all, archive_all, delete_all, cancel_all, stop_all)"
        )
        return _json(error_body(404, message), 404)
    return _json({"ok": True, "count": count, **extra})


async def batch_action(request: Request) -> Response:
    _, insp = _inspector(request)
    queue = request.path_params["queue"]
    action = request.path_params["action"]
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # 3.11 cannot parse ~1,000 levels; 3.12+ can
        raise ValueError('the request body must be JSON: {"ids": [...]}') from None
    ids = body.get("ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise ValueError('the request body must be the JSON object {"ids": ["<task id>", ...]}')
    if len(ids) > BATCH_LIMIT:
        raise ValueError(f"at most {BATCH_LIMIT} task IDs per batch, got {len(ids)}")
    ops: dict[str, Callable[[str, str], Awaitable[None]]] = {
        "run": insp.run_task,
        "archive": insp.archive_task,
        "delete": insp.delete_task,
    }

    async def cancel(q: str, task_id: str) -> None:
        await _cancel(insp, q, task_id)

    async def stop(q: str, task_id: str) -> None:
        await _cancel(insp, q, task_id, retry=False)

    ops["cancel"] = cancel
    ops["stop"] = stop
    op = ops.get(action)
    if op is None:
        message = f"unknown batch action {action!r} (run, archive, delete, cancel, stop)"
        return _json(error_body(404, message), 404)
    done: list[str] = []
    errors: dict[str, str] = {}
    for task_id in ids:
        try:
            await op(queue, task_id)
        except (TaskNotFoundError, FailedPreconditionError, ValueError) as exc:
            errors[task_id] = str(exc)
        else:
            done.append(task_id)
    return _json({"ok": not errors, "done": done, "errors": errors})


def api_routes() -> list[Route]:
    return [
        Route("/api/queues", list_queues),
        Route("/api/stats", stats),
        Route("/api/queues/{queue}", get_queue),
        Route("/api/queues/{queue}", delete_queue, methods=["DELETE"]),
        Route("/api/queues/{queue}/pause", pause, methods=["POST"]),
        Route("/api/queues/{queue}/resume", resume, methods=["POST"]),
        Route("/api/queues/{queue}/groups", list_groups),
        Route("/api/queues/{queue}/tasks", list_tasks),
        Route("/api/queues/{queue}/tasks/{task_id}", get_task),
        Route("/api/queues/{queue}/tasks/{task_id}", delete_task, methods=["DELETE"]),
        Route("/api/queues/{queue}/tasks/{task_id}/{action}", task_action, methods=["POST"]),
        Route("/api/queues/{queue}/states/{state}/{action}", bulk_action, methods=["POST"]),
        Route("/api/queues/{queue}/batch/{action}", batch_action, methods=["POST"]),
        Route("/api/tasks/{task_id}", search_task),
        Route("/api/servers", servers),
        Route("/api/type-rates", type_rates),
        Route("/api/schedulers", schedulers),
        Route("/api/schedulers/{entry_id}/events", scheduler_events),
        Route("/api/redis", redis_info),
    ]
