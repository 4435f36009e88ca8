"""``create_app``: the asyncq web UI, JSON API and Prometheus endpoint as one ASGI app."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path

import structlog
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from asyncq import (
    DurableRunNotFoundError,
    FailedPreconditionError,
    Inspector,
    QueueNotEmptyError,
    QueueNotFoundError,
    TaskNotFoundError,
    WorkflowNotFoundError,
)
from asyncq._http import SegmentPaths, route_segments
from asyncq._redis.options import RedisTarget
from asyncq.web._api import api_routes
from asyncq.web._durable import durable_routes
from asyncq.web._errors import error_body
from asyncq.web._events import events_routes
from asyncq.web._history import history_routes
from asyncq.web._pages import page_routes, render
from asyncq.web._security import Auth, SecurityMiddleware
from asyncq.web._state import WebState, state
from asyncq.web._triage import triage_routes
from asyncq.web._workflows import workflow_routes

__all__ = ["create_app"]

_log = structlog.get_logger("asyncq.web")
_STATIC = Path(__file__).parent / "static"


def _redact(uri: str) -> str:
    from asyncq._redis.options import redact_uri

    return redact_uri(uri)


async def metrics(request: Request) -> Response:
    """asynq x/metrics queue metrics, read through the Inspector at each scrape."""
    try:
        from asyncq.metrics import collect_queue_metrics, render
    except ImportError as exc:
        return JSONResponse(error_body(501, str(exc)), status_code=501)
    families = await collect_queue_metrics(state(request).inspector())
    return Response(render(families), media_type="text/plain; version=0.0.4; charset=utf-8")


def _error(request: Request, status: int, message: str, code: str | None = None) -> Response:
    path = request.url.path[len(request.scope.get("root_path", "")) :]
    if path.startswith("/api/") or path == "/metrics":
        return JSONResponse(error_body(status, message, code=code), status_code=status)
    return render(request, "error.html", {"status": status, "message": message}, status)


_NOT_FOUND_CODES: dict[type[Exception], str] = {
    QueueNotFoundError: "queue_not_found",
    TaskNotFoundError: "task_not_found",
    WorkflowNotFoundError: "workflow_not_found",
    DurableRunNotFoundError: "durable_run_not_found",
}


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error(request, 404, str(exc), _NOT_FOUND_CODES.get(type(exc), "not_found"))


async def _conflict(request: Request, exc: Exception) -> Response:
    return _error(request, 409, str(exc))


async def _bad_request(request: Request, exc: Exception) -> Response:
    return _error(request, 400, str(exc))


async def _redis_down(request: Request, exc: Exception) -> Response:
    st = state(request)
    if isinstance(exc, AuthenticationError):
        message = f"Redis at {st.address} refused the credentials"
    else:
        message = f"Redis at {st.address} is unreachable ({exc.__class__.__name__}: {exc})"
    _log.warning("redis unreachable", address=st.address, error=exc.__class__.__name__)
    return _error(request, 503, message)


async def _redis_error(request: Request, exc: Exception) -> Response:
    return _error(request, 502, f"Redis replied with an error: {exc}")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(request, exc.status_code, str(exc.detail))


class _Inject:
    """Puts the WebState in every request's scope (so handlers find it when mounted)."""

    def __init__(self, app: ASGIApp, web: WebState) -> None:
        self.app = app
        self.web = web

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope["asyncq.web"] = self.web
        await self.app(scope, receive, send)


async def _favicon(request: Request) -> Response:
    return RedirectResponse(request.url_for("static", path="favicon.svg"), status_code=301)


def create_app(
    redis: RedisTarget | Inspector = "redis://127.0.0.1:6379/0",
    *,
    read_only: bool = False,
    username: str | None = None,
    password: str | None = None,
    token: str | None = None,
    poll_interval: timedelta = timedelta(seconds=5),
    page_size: int = 30,
    max_payload_length: int = 200,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The asyncq web UI (pages, ``/api/`` JSON API and ``/metrics``) as a Starlette app.

    *redis* is a URI, connection options, a redis-py client or a ready
    :class:`~asyncq.Inspector` (left open). Mount it in another app with
    ``app.mount("/asyncq", create_app(...))``; links and the API follow the prefix.

    *read_only* hides every action and answers 405 to any mutation. *username*
    and *password* require HTTP basic auth; *token* requires
    ``Authorization: Bearer <token>`` (or basic auth with the token as password).
    Mutations must carry the ``X-Asyncq-Request: 1`` header and come from the
    same origin, so another site cannot make a browser change queues.
    *poll_interval* is the pages' default refresh period (the page lets the user
    change it); *page_size* the default rows per page; *max_payload_length* the
    characters of payload shown in tables. *allowed_hosts* (e.g. ``["localhost",
    "127.0.0.1"]``) refuses requests whose ``Host`` header names another host, which
    stops DNS-rebinding pages from reaching a UI on localhost; None allows any.
    """
    if not isinstance(poll_interval, timedelta):
        raise TypeError(
            f"poll_interval must be a datetime.timedelta, got {poll_interval.__class__.__name__}"
        )
    if poll_interval < timedelta(seconds=1):
        raise ValueError(f"poll_interval must be at least 1 second, got {poll_interval}")
    if page_size < 1 or page_size > 500:
        raise ValueError(f"page_size must be 1..500, got {page_size}")
    if max_payload_length < 10:
        raise ValueError(f"max_payload_length must be at least 10, got {max_payload_length}")
    auth = Auth(username=username, password=password, token=token)
    if isinstance(redis, str):
        address = _redact(redis)
    elif isinstance(redis, Inspector):
        address = "the given Inspector's Redis"
    else:
        address = redis.__class__.__name__
    web = WebState(
        target=redis,
        address=address,
        read_only=read_only,
        poll_seconds=poll_interval.total_seconds(),
        page_size=page_size,
        max_payload_length=max_payload_length,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await web.aclose()

    routes: list[Route | Mount] = [
        *page_routes(),
        *api_routes(),
        *workflow_routes(),
        *durable_routes(),
        *triage_routes(),
        *history_routes(),
        *events_routes(),
        Route("/metrics", metrics),
        # Browsers ask for /favicon.ico whatever the page links; send them to the icon.
        Route("/favicon.ico", _favicon),
        Mount("/static", StaticFiles(directory=str(_STATIC)), name="static"),
    ]
    route_segments(routes)
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            HTTPException: _http_error,
            QueueNotFoundError: _not_found,
            TaskNotFoundError: _not_found,
            WorkflowNotFoundError: _not_found,
            DurableRunNotFoundError: _not_found,
            FailedPreconditionError: _conflict,
            QueueNotEmptyError: _conflict,
            ValueError: _bad_request,
            RedisConnectionError: _redis_down,
            RedisTimeoutError: _redis_down,
            ConnectionError: _redis_down,
            TimeoutError: _redis_down,
            ResponseError: _redis_error,
        },
    )
    app.state.asyncq = web
    app.add_middleware(SecurityMiddleware, auth=auth, read_only=read_only, public=("/static/",))
    if allowed_hosts is not None:
        if isinstance(allowed_hosts, str) or not all(isinstance(h, str) for h in allowed_hosts):
            raise TypeError("allowed_hosts must be a sequence of host names")
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    app.add_middleware(_Inject, web=web)
    app.add_middleware(SegmentPaths)
    return app
