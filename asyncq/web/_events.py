"""The live event tail page and its JSON feed (the task event stream, asyncq.events)."""

from __future__ import annotations

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


def _filters(request: Request) -> tuple[str, str, str]:
    params = request.query_params
    kind = params.get("kind") or ""
    if kind and kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r}; expected one of {', '.join(EVENT_KINDS)}")
    return params.get("queue") or "", params.get("type") or "", kind


def _keep(e: Event, queue: str, task_type: str, kind: str) -> bool:
    return (
        (not queue or e.queue == queue)
        and (not task_type or e.type == task_type)
        and (not kind or e.kind == kind)
    )


def _order(stream_id: str) -> tuple[int, ...]:
    return tuple(int(part) for part in stream_id.split("-"))


async def _events(
    request: Request, after: str | None
) -> tuple[list[Event], list[SkippedEvent], str | None]:
    """The events to show, the unreadable entries among those read (named in one warning
    line) and the ID the next feed call resumes after (None: nothing read yet)."""
    _, insp = _inspector(request)
    queue, task_type, kind = _filters(request)
    limit = _int(request, "limit", PAGE_EVENTS, hi=PAGE_EVENTS)
    found = await recent_events(insp.redis, count=_SCAN, after=after)
    kept = [e for e in found.events if _keep(e, queue, task_type, kind)]
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
    """``GET /api/events?after=<id>&queue=&type=&kind=``: events after *after*, oldest first,
    the entries skipped as unreadable, and ``last``: the ``after`` of the next call."""
    events, skipped, last = await _events(request, request.query_params.get("after") or None)
    return _json(
        {
            "events": [e.as_dict() for e in events],
            "skipped": [s.as_dict() for s in skipped],
            "last": last,
        }
    )


async def events_page(request: Request) -> Response:
    _, insp = _inspector(request)
    queue, task_type, kind = _filters(request)
    events, skipped, last = await _events(request, None)
    return render(
        request,
        "events.html",
        {
            "events": list(reversed(events)),
            "skipped": skipped,
            "last": last or "",
            "queue_filter": queue,
            "type_filter": task_type,
            "kind_filter": kind,
            "kinds": EVENT_KINDS,
            "all_queues": await insp.queues(),
            "nav": "events",
        },
    )


def events_routes() -> list[Route]:
    return [Route("/events", events_page), Route("/api/events", api_events)]
