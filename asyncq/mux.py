"""ServeMux: routes a task to its handler by type, as asynq's ServeMux does.

Matching: an exact type match first, otherwise the longest registered pattern
that is a plain string prefix of the type (not segment-aware: ``"email"``
matches ``"emailx"``). No match raises :class:`~asyncq.errors.HandlerNotFoundError`,
which the server treats as any other failure (retry, then archive).

Middleware (``Callable[[Handler], Handler]``) wraps handlers in registration
order, the first one registered outermost; it also wraps the not-found path.

Handlers are ``async def handle(task) -> None``. A plain ``def`` handler runs in
a worker thread (anyio) bounded by its own :class:`anyio.CapacityLimiter`, so
blocking code never stalls the event loop; the server sets that limit with
``Server(limits=Limits(sync_concurrency=...))``.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar, overload

import anyio
import anyio.to_thread

from asyncq.errors import HandlerNotFoundError
from asyncq.task import Task

__all__ = [
    "Handler",
    "Middleware",
    "ServeMux",
    "SyncHandler",
    "as_async_handler",
    "is_async_callable",
]

Handler: TypeAlias = Callable[[Task], Awaitable[None]]
"""An async handler: ``async def handle(task: Task) -> None``."""
SyncHandler: TypeAlias = Callable[[Task], None]
"""A blocking handler, run in a worker thread."""
Middleware: TypeAlias = Callable[[Handler], Handler]
"""Wraps a handler and returns a new one."""

_AnyHandler = TypeVar("_AnyHandler", bound=Callable[[Task], Any])

_CACHE_LIMIT = 1024


class SyncThreads:
    """The worker threads sync handlers run in: at most *size* at once.

    Its anyio limiter is made when the first sync handler runs: making one imports
    anyio's asyncio backend, which cost an async-only worker a third of its start-up CPU.
    """

    __slots__ = ("_limiter", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._limiter: anyio.CapacityLimiter | None = None

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.size)
        return self._limiter


sync_threads: contextvars.ContextVar[SyncThreads | None] = contextvars.ContextVar(
    "asyncq_sync_threads", default=None
)
"""The threads of sync handlers; the server's processor sets them for its tasks."""


def sync_limiter() -> anyio.CapacityLimiter | None:
    """The limiter of this task's sync handler threads; None: anyio's default limiter."""
    threads = sync_threads.get()
    return None if threads is None else threads.limiter


def is_async_callable(fn: object) -> bool:
    """True for coroutine functions, partials of them and objects with an async __call__."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def as_async_handler(fn: Callable[[Task], Any]) -> Handler:
    """*fn* itself when it is async, else an async wrapper running it in a worker thread."""
    if not callable(fn):
        raise TypeError(f"handler must be callable, got {fn.__class__.__name__}")
    if is_async_callable(fn):
        return fn

    sync_fn: Callable[[Task], Any] = fn

    async def run_in_thread(task: Task) -> None:
        # abandon_on_cancel: a cancelled task (deadline, shutdown) returns at once;
        # Python cannot stop the thread, which finishes in the background.
        await anyio.to_thread.run_sync(
            sync_fn, task, abandon_on_cancel=True, limiter=sync_limiter()
        )

    functools.update_wrapper(run_in_thread, sync_fn)
    return run_in_thread


async def _not_found(task: Task) -> None:
    raise HandlerNotFoundError(task.type)


class ServeMux:
    """A task router: register handlers by type pattern, add middleware, then serve.

    >>> mux = ServeMux()
    >>> @mux.handler("email:welcome")
    ... async def welcome(task: Task) -> None: ...
    """

    __slots__ = ("_cache", "_exact", "_middlewares", "_not_found", "_prefixes")

    def __init__(self) -> None:
        self._exact: dict[str, Handler] = {}
        self._prefixes: list[tuple[str, Handler]] = []  # longest pattern first
        self._middlewares: list[Middleware] = []
        self._cache: dict[str, Handler] = {}
        self._not_found: Handler | None = None

    def handle(self, pattern: str, handler: Callable[[Task], Any]) -> None:
        """Register *handler* (async, or sync run in a thread) for *pattern*.

        Raises ValueError for a blank or duplicate pattern, TypeError for a non-callable.
        """
        if not isinstance(pattern, str):
            raise TypeError(f"handler pattern must be a str, got {pattern.__class__.__name__}")
        if not pattern.strip():
            raise ValueError("invalid handler pattern: it must contain non-blank characters")
        if handler is None or not callable(handler):
            raise TypeError(
                f"handler for {pattern!r} must be callable, got {handler.__class__.__name__}"
            )
        if pattern in self._exact:
            raise ValueError(f"multiple registrations for handler pattern {pattern!r}")
        wrapped = as_async_handler(handler)
        self._exact[pattern] = wrapped
        self._prefixes.append((pattern, wrapped))
        self._prefixes.sort(key=lambda item: len(item[0]), reverse=True)
        self._cache.clear()

    @overload
    def handler(self, pattern: str) -> Callable[[_AnyHandler], _AnyHandler]: ...
    @overload
    def handler(self, pattern: str, fn: _AnyHandler) -> _AnyHandler: ...
    def handler(self, pattern: str, fn: Any = None) -> Any:
        """Decorator form of :meth:`handle`; returns the function unchanged."""
        if fn is not None:
            self.handle(pattern, fn)
            return fn

        def register(func: _AnyHandler) -> _AnyHandler:
            self.handle(pattern, func)
            return func

        return register

    def use(self, *middlewares: Middleware) -> None:
        """Append middleware; the first registered is the outermost wrapper."""
        for mw in middlewares:
            if not callable(mw):
                raise TypeError(f"middleware must be callable, got {mw.__class__.__name__}")
            if is_async_callable(mw):
                # An ``async def`` middleware returns a coroutine, not a handler: every
                # task would fail at run time, so refuse it where the mistake is made.
                raise TypeError(
                    f"middleware {getattr(mw, '__qualname__', mw)!r} is an async function; "
                    "a middleware is a plain function that takes the next handler and "
                    "returns an async handler"
                )
        self._middlewares.extend(middlewares)
        self._cache.clear()
        self._not_found = None

    def match(self, task_type: str) -> tuple[Handler, str] | None:
        """The registered (unwrapped) handler and pattern for *task_type*, or None."""
        exact = self._exact.get(task_type)
        if exact is not None:
            return exact, task_type
        for pattern, handler in self._prefixes:
            if task_type.startswith(pattern):
                return handler, pattern
        return None

    def resolve(self, task_type: str) -> Handler:
        """The handler for *task_type* with every middleware applied (cached)."""
        handler = self._cache.get(task_type)
        if handler is not None:
            return handler
        found = self.match(task_type)
        if found is None:
            if self._not_found is None:
                self._not_found = self._wrap(_not_found)
            return self._not_found
        handler = self._wrap(found[0])
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[task_type] = handler
        return handler

    def _wrap(self, handler: Handler) -> Handler:
        for mw in reversed(self._middlewares):
            handler = mw(handler)
            if not callable(handler):
                raise TypeError(f"middleware {mw!r} returned a non-callable")
        return handler

    async def __call__(self, task: Task) -> None:
        """Process *task* with its handler (asynq's ``ServeMux.ProcessTask``)."""
        await self.resolve(task.type)(task)

    def __repr__(self) -> str:
        return f"<ServeMux patterns={sorted(self._exact)} middlewares={len(self._middlewares)}>"
