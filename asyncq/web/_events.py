"""The live event tail page and its JSON feed (the task event stream, asyncq.events)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from asyncq.events import EVENT_KINDS, Event, SkippedEvent, log_skipped, recent_events
from asyncq.web._api import _inspector, _int, _json
from asyncq.web._pages import render

__all__ = ["events_routes"]

PAGE_EVENTS = 200
"""Events the page shows at first and a feed call returns at most."""
_SCAN = 5_000  # stream entries one feed call reads to find filtered events


@dataclass(frozen=True, slots=True)
class _Filters:
    queue: str
    task_type: str
    kind: str
    workflow: str
    task: str
    progress: bool
    """Whether ``progress`` events are shown (several a second per running task, they
    would push every other event off the Events page; the page hides them unless asked)."""

    def keeps(self, e: Event) -> bool:
        return (
            (not self.queue or e.queue == self.queue)
            and (not self.task_type or e.type == self.task_type)
            and (not self.kind or e.kind == self.kind)
            and (not self.workflow or e.workflow == self.workflow)
            and (not self.task or e.task_id == self.task)
            and (self.progress or e.kind != "progress")
        )


def _filters(request: Request, *, progress_default: bool) -> _Filters:
    params = request.query_params
    kind = params.get("kind") or ""
    if kind and kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r}; expected one of {', '.join(EVENT_KINDS)}")
    raw = params.get("progress")
    if raw not in (None, "", "0", "1"):
        raise ValueError(f"progress must be 0 or 1, got {raw!r}")
    progress = progress_default if not raw else raw == "1"
    return _Filters(
        params.get("queue") or "",
        params.get("type") or "",
        kind,
        params.get("workflow") or "",
        params.get("task") or "",
        progress or kind == "progress",  # asking for progress events shows them
    )


def _order(stream_id: str) -> tuple[int, ...]:
    return tuple(int(part) for part in stream_id.split("-"))


async def _events(
    request: Request, after: str | None, filters: _Filters
) -> tuple[list[Event], list[SkippedEvent], str | None]:
    """The events to show, the unreadable entries among those read (named in one warning
    line) and the ID the next feed call resumes after (None: nothing read yet)."""
    _, insp = _inspector(request)
    limit = _int(request, "limit", PAGE_EVENTS, hi=PAGE_EVENTS)
    found = await recent_events(insp.redis, count=_SCAN, after=after)
    kept = [e for e in found.events if filters.keeps(e)]
    skipped, last = found.skipped, found.last
    if not after:
        kept = kept[-limit:]
    elif len(kept) > limit:
        # The next call resumes after the last event shown: what lies beyond it, the
        # unreadable entries too, is that call's to show and name.
        kept = kept[:limit]
        last = kept[-1].id
        skipped = [s for s in skipped if _order(s.id) < _order(last)]
    log_skipped(skipped)
    return kept, skipped, last


async def api_events(request: Request) -> Response:
    """``GET /api/events?after=<id>&queue=&type=&kind=&workflow=&task=&progress=``: events
    after *after*, oldest first, the entries skipped as unreadable, and ``last``: the
    ``after`` of the next call. ``progress=0`` leaves out ``progress`` events (kept by
    default here; the Events page asks for them with ``progress=1``)."""
    filters = _filters(request, progress_default=True)
    after = request.query_params.get("after") or None
    events, skipped, last = await _events(request, after, filters)
    return _json(
        {
            "events": [e.as_dict() for e in events],
            "skipped": [s.as_dict() for s in skipped],
            "last": last,
        }
    )


async def events_page(request: Request) -> Response:
    _, insp = _inspector(request)
    filters = _filters(request, progress_default=False)
    events, skipped, last = await _events(request, None, filters)
    return render(
        request,
        "events.html",
        {
            "events": list(reversed(events)),
            "skipped": skipped,
            "last": last or "",
            "queue_filter": filters.queue,
            "type_filter": filters.task_type,
            "kind_filter": filters.kind,
            "workflow_filter": filters.workflow,
            "task_filter": filters.task,
            "show_progress": filters.progress,
            "kinds": EVENT_KINDS,
            "all_queues": await insp.queues(),
            "nav": "events",
        },
    )


def events_routes() -> list[Route]:
    return [Route("/events", events_page), Route("/api/events", api_events)]
