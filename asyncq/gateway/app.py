"""The HTTP enqueue gateway: a Starlette ASGI app in front of an asyncq Client.

Routes (relative to wherever the app is mounted):

- ``POST /api/queues/{queue}/tasks``: enqueue one task, 201 with its TaskInfo.
- ``POST /api/queues/{queue}/tasks/batch``: enqueue several, one result each.
- ``GET  /api/queues/{queue}/tasks/{task_id}``: the task's state and result.
- ``GET  /api/health``: 200 when Redis answers, else 503.
- ``GET  /api/openapi.json``: the OpenAPI 3.1 description.

Every error is ``{"error": {"code", "message", "field"}}`` with 400 (bad
input), 401 (token), 404, 409 (duplicate or task id conflict), 413 (too
large), 415 (not JSON) or 503 (Redis unreachable). Payloads never reach the logs.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from asyncq import (
    Client,
    Connection,
    DuplicateTaskError,
    EnqueueRetryError,
    Inspector,
    QueueNotFoundError,
    RedisOutOfMemoryError,
    TaskIdConflictError,
    TaskInfo,
    TaskNotFoundError,
)
from asyncq._http import (
    SegmentPaths,
    is_loopback,
    listening_address,
    loopback_host_problem,
    route_segments,
)
from asyncq._redis.options import RedisTarget
from asyncq.gateway._openapi import openapi_document
from asyncq.gateway._schema import (
    BatchItemResult,
    BatchRequest,
    BatchResponse,
    EnqueueRequest,
    ErrorDetail,
    load_json,
    task_info_body,
)

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_MAX_BODY_BYTES", "GatewayState", "create_app"]

DEFAULT_MAX_BODY_BYTES = 8 << 20
"""Largest request body accepted by default (8 MiB)."""
DEFAULT_MAX_BATCH = 1000
"""Most tasks accepted in one batch request by default."""

_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError)

log = structlog.get_logger("asyncq.gateway")


class ApiError(Exception):
    """An error answered as ``{"error": {...}}`` with an HTTP status."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(code=code, message=message, field=field)


@dataclass(slots=True)
class GatewayState:
    """The gateway's Redis handles, made on first use inside the serving event loop."""

    target: RedisTarget | Connection | Client
    client: Client | None = None
    inspector: Inspector | None = None
    _conn: Connection | None = field(default=None, repr=False)

    def handles(self) -> tuple[Client, Inspector]:
        if self.client is None or self.inspector is None:
            if isinstance(self.target, Client):
                self.client = self.target
            else:
                self._conn = (
                    self.target if isinstance(self.target, Connection) else Connection(self.target)
                )
                self.client = Client(self._conn)
            self.inspector = Inspector(self.client.redis)
        return self.client, self.inspector

    async def aclose(self) -> None:
        """Close the connection the gateway made (a Client or Connection passed in stays open)."""
        conn, self._conn = self._conn, None
        self.client = self.inspector = None
        if conn is not None and conn is not self.target:
            await conn.aclose()


def _error_response(
    status: int, detail: ErrorDetail, headers: dict[str, str] | None = None
) -> Response:
    return JSONResponse({"error": detail.model_dump()}, status_code=status, headers=headers)


def _field_of(err: dict[str, Any], prefix: str = "") -> str | None:
    ctx = err.get("ctx") or {}
    named = getattr(ctx.get("error"), "field", None)
    parts = [str(p) for p in err.get("loc", ())]
    if named is not None:
        parts = [*parts, named]
    if not parts:
        return prefix.rstrip(".") or None
    return prefix + ".".join(parts)


def _validation_error(exc: ValidationError, prefix: str = "") -> ApiError:
    err = exc.errors(include_url=False)[0]
    ctx = err.get("ctx") or {}
    cause = ctx.get("error")
    message = getattr(cause, "message", None) or str(err.get("msg", "invalid value"))
    if isinstance(cause, ValueError) and not getattr(cause, "message", None):
        message = str(cause)  # our own check's words, without pydantic's "Value error, "
    field_name = _field_of(dict(err), prefix)
    kind = str(err.get("type", ""))
    if kind == "extra_forbidden":
        message = f"unknown field {field_name!r}"
    elif kind.startswith("time_delta"):
        message = (
            f"{field_name} must be seconds or a duration such as '90s', '1h30m' or 'PT90S', "
            f"got {err.get('input')!r}"
        )
    elif field_name and not getattr(cause, "message", None):
        message = f"{field_name}: {message}"
    return ApiError(400, "invalid_request", message, field_name)


def _enqueue_error(exc: Exception) -> ApiError:
    if isinstance(exc, RedisOutOfMemoryError):
        return ApiError(503, "redis_out_of_memory", str(exc))
    if isinstance(exc, DuplicateTaskError):
        return ApiError(409, "duplicate_task", str(exc), "unique")
    if isinstance(exc, TaskIdConflictError):
        return ApiError(409, "task_id_conflict", str(exc), "task_id")
    if isinstance(exc, ValueError | TypeError):
        return ApiError(400, "invalid_request", str(exc))
    raise exc


def create_app(
    redis: RedisTarget | Connection | Client,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> Starlette:
    """The gateway as a Starlette app, ready to serve or mount under a prefix.

    *redis* is what :class:`asyncq.Client` accepts (a URI, options, a
    redis-py client, a Connection) or a ready Client, which is shared and
    left open. With a *token*, every request needs ``Authorization: Bearer
    <token>``; without one, only loopback clients are served (401 for any
    other), so bind to 127.0.0.1 or give a token.

    The Redis connection is made on first use and closed by the app's
    lifespan; when mounted in an app that does not run sub-app lifespans,
    call ``await app.state.gateway.aclose()`` at shutdown.
    """
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise ValueError("the gateway token cannot be empty")
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be positive, got {max_batch}")
    state = GatewayState(redis)
    expected = f"Bearer {token}".encode() if token is not None else None

    def authorize(request: Request) -> None:
        if expected is None:
            host = request.client.host if request.client else None
            if not is_loopback(host):
                raise ApiError(
                    401,
                    "unauthorized",
                    "this gateway has no token and serves loopback clients only; "
                    "start it with a token to serve other hosts",
                )
            # A page on another site whose DNS name now points at 127.0.0.1 connects from
            # loopback too, but its requests carry its own name in Host: the web UI's rule.
            problem = loopback_host_problem(
                request.headers.get("host"), listening_address(request.scope)
            )
            if problem is not None:
                raise ApiError(
                    400,
                    "invalid_host",
                    f"{problem}; a gateway without a token serves only those, so a "
                    "DNS-rebinding page cannot reach it: start it with a token to serve "
                    "other names",
                )
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise ApiError(401, "unauthorized", "missing or wrong bearer token")

    async def read_json(request: Request) -> Any:
        ctype = request.headers.get("content-type", "")
        if ctype.split(";")[0].strip().lower() != "application/json":
            raise ApiError(
                415,
                "unsupported_media_type",
                "send the request body as JSON with 'Content-Type: application/json'",
            )
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            raise ApiError(413, "payload_too_large", f"request body is over {max_body_bytes} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise ApiError(
                    413, "payload_too_large", f"request body is over {max_body_bytes} bytes"
                )
            chunks.append(chunk)
        body = b"".join(chunks)
        if body.startswith(b"\xef\xbb\xbf"):
            raise ApiError(
                400,
                "invalid_json",
                "request body starts with a byte order mark: send UTF-8 without one",
            )
        if b"\x00" in body:  # JSON text never holds a raw NUL: UTF-16 or UTF-32
            raise ApiError(
                400,
                "invalid_json",
                "request body holds NUL bytes (UTF-16 or UTF-32?); JSON must be sent as UTF-8",
            )
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApiError(
                400,
                "invalid_json",
                f"request body is not UTF-8 (byte {exc.start}); JSON must be sent as UTF-8",
            ) from None
        try:
            return load_json(text)
        except ValueError as exc:
            raise ApiError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None

    def queue_of(request: Request) -> str:
        queue: str = request.path_params["queue"]
        if not queue.strip():
            raise ApiError(400, "invalid_request", "queue name cannot be blank", "queue")
        return queue

    def parse_item(data: Any, prefix: str = "") -> EnqueueRequest:
        try:
            return EnqueueRequest.model_validate(data)
        except ValidationError as exc:
            raise _validation_error(exc, prefix) from None

    async def enqueue(request: Request) -> Response:
        authorize(request)
        queue = queue_of(request)
        item = parse_item(await read_json(request))
        client, _ = state.handles()
        try:
            info = await client.enqueue(item.task(), **item.options(queue))
        except (
            DuplicateTaskError,
            TaskIdConflictError,
            RedisOutOfMemoryError,
            ValueError,
            TypeError,
        ) as exc:
            raise _enqueue_error(exc) from None
        log.info("task enqueued over HTTP", task_id=info.id, task_type=info.type, queue=queue)
        return _task_response(info, 201)

    async def enqueue_batch(request: Request) -> Response:
        authorize(request)
        queue = queue_of(request)
        try:
            batch = BatchRequest.model_validate(await read_json(request))
        except ValidationError as exc:
            raise _validation_error(exc) from None
        if len(batch.tasks) > max_batch:
            raise ApiError(
                413,
                "payload_too_large",
                f"a batch holds at most {max_batch} tasks, got {len(batch.tasks)}",
                "tasks",
            )
        results: list[BatchItemResult | None] = []
        valid: list[tuple[int, EnqueueRequest]] = []
        for i, raw in enumerate(batch.tasks):
            try:
                valid.append((i, parse_item(raw, f"tasks.{i}.")))
                results.append(None)
            except ApiError as exc:
                results.append(BatchItemResult(status=exc.status, error=exc.detail))
        client, _ = state.handles()
        outcomes = await client.enqueue_many([(r.task(), r.options(queue)) for _, r in valid])
        for (i, _), outcome in zip(valid, outcomes, strict=True):
            if isinstance(outcome, TaskInfo):
                results[i] = BatchItemResult(status=201, task=task_info_body(outcome))
            else:
                err = _enqueue_error(outcome)
                results[i] = BatchItemResult(status=err.status, error=err.detail)
        done = [r for r in results if r is not None]
        written = sum(r.status == 201 for r in done)
        log.info("batch enqueued over HTTP", queue=queue, items=len(done), written=written)
        body = BatchResponse(results=done).model_dump(mode="json")
        return JSONResponse(body, status_code=200)

    async def get_task(request: Request) -> Response:
        authorize(request)
        queue = queue_of(request)
        _, inspector = state.handles()
        try:
            info = await inspector.get_task(queue, request.path_params["task_id"])
        except QueueNotFoundError as exc:
            raise ApiError(404, "queue_not_found", str(exc), "queue") from None
        except TaskNotFoundError as exc:
            raise ApiError(404, "task_not_found", str(exc), "task_id") from None
        return _task_response(info, 200)

    async def health(request: Request) -> Response:
        authorize(request)
        client, _ = state.handles()
        await client.ping()
        return JSONResponse({"status": "ok"})

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document(request.scope.get("root_path", "")))

    def guard(
        endpoint: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            try:
                return await endpoint(request)
            except ApiError as exc:
                headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
                return _error_response(exc.status, exc.detail, headers)
            except (*_REDIS_DOWN, EnqueueRetryError) as exc:
                # EnqueueRetryError: the Client's retries (connection-level failures) ran out.
                log.warning("Redis unreachable", error=f"{type(exc).__name__}: {exc}")
                detail = ErrorDetail(code="redis_unavailable", message="Redis is unreachable")
                return _error_response(503, detail, {"Retry-After": "1"})

        return guarded

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await state.aclose()

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error_response(404, ErrorDetail(code="not_found", message="no such endpoint"))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _error_response(
            405, ErrorDetail(code="method_not_allowed", message="method not allowed here")
        )

    async def internal(request: Request, exc: Exception) -> Response:
        log.error("gateway request failed", error=f"{type(exc).__name__}: {exc}")
        return _error_response(500, ErrorDetail(code="internal", message="internal error"))

    routes = [
        Route("/api/queues/{queue}/tasks", guard(enqueue), methods=["POST"]),
        Route("/api/queues/{queue}/tasks/batch", guard(enqueue_batch), methods=["POST"]),
        Route("/api/queues/{queue}/tasks/{task_id}", guard(get_task), methods=["GET"]),
        Route("/api/health", guard(health), methods=["GET"]),
        Route("/api/openapi.json", openapi, methods=["GET"]),
    ]
    route_segments(routes)
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: not_allowed, Exception: internal},
    )
    app.state.gateway = state
    app.add_middleware(SegmentPaths)
    return app


def _task_response(info: TaskInfo, status: int) -> Response:
    return JSONResponse(task_info_body(info).model_dump(mode="json"), status_code=status)
