"""Stopping a handler that ignores its stop: its cleanup finishes where it began.

Why this module exists. A handler runs inline in its task's coroutine (see
:mod:`asyncq._worker.attempt`): a second asyncio task per handler would cost
about a third more worker CPU per task (measured, issue 38). When its lease
expires, its deadline passes or a cancel request comes, the coroutine's
:class:`~asyncq._worker.select.FirstOf` cancels it, and it should return. Some
handlers do not: they swallow the ``CancelledError``, or their cleanup awaits
something slow. asynq does not wait for a handler that ignores its context, and
neither may the worker: the failure must be written and the slot freed after
``CANCEL_GRACE``. But the handler cannot simply be abandoned mid-await either,
because its cleanup (``finally`` blocks, anyio's shielded scopes, an HTTP
client closing its connection) must finish in the task it began in.

:func:`until_swallowed` therefore drives the handler's awaits itself: until the
stop it passes them to the event loop unchanged (costing nothing per task);
from the stop on it bounds each of them by the rest of the grace, and when that
runs out hands back the handler's suspended steps, which :func:`outlive` continues
in an asyncio task of their own (an *orphan*) while the caller writes the
failure.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable, Generator
from functools import partial
from typing import Any

__all__ = ["Rest", "outlive", "until_swallowed"]

_Steps = Generator[Any, None, Any]
"""An awaitable's ``__await__()`` iterator: what the event loop drives."""

Rest = tuple[_Steps, Any]
"""A handler left suspended: its steps and the future it waits on."""


@types.coroutine
def until_swallowed(
    handler: Awaitable[None], stopped: Callable[[], bool], grace: Callable[[], float]
) -> Generator[Any, None, Rest | None]:
    """``await handler``, except when the handler outlives the processor's stop request.

    Returns None once the handler returned, and raises what it raised. Until the
    processor asks the task to stop (*stopped()*), the handler's awaits are passed to
    the event loop as they are: this costs nothing per task. From then on, each await
    is also bounded by the rest of *grace()* seconds: a handler that is still running
    after it ignores its cancellation, and its steps and what it waits on are returned,
    for :func:`outlive` in a task of its own; the caller can then write the failure and
    free the slot while the handler runs on. Cleanup that awaits after a cancellation
    (``finally`` blocks, anyio's shielded scopes, an HTTP client closing its
    connection) therefore finishes in the task it began in, and only a handler that
    really ignores its cancellation costs a second task.
    """
    steps = handler.__await__()
    thrown: BaseException | None = None
    loop = asyncio.get_running_loop()
    until: float | None = None  # when the grace after the stop request runs out
    while True:
        try:
            pending = steps.send(None) if thrown is None else steps.throw(thrown)
        except StopIteration:
            return None
        thrown = None
        if until is None and stopped():
            until = loop.time() + grace()
        try:
            if until is None or not isinstance(pending, asyncio.Future):
                yield pending
            elif not (yield from _wait_until(loop, pending, until)):
                return steps, pending
        except GeneratorExit:  # closed, as `await` closes what it awaits (PEP 380)
            steps.close()
            raise
        except BaseException as exc:  # the task was cancelled, or the awaited future raised
            thrown = exc


@types.coroutine
def _wait_until(
    loop: asyncio.AbstractEventLoop, pending: asyncio.Future[Any], until: float
) -> Generator[Any, None, bool]:
    """Wait for the future a handler awaits, *pending*, until the loop time *until*;
    whether it is done. The handler is then stepped as its task would step it (the
    future's ``__await__`` reads its result); a cancellation of this task while it
    waits is passed on to *pending*, as a task passes it to the future it awaits."""
    pending._asyncio_future_blocking = False
    timed_out = False
    while not pending.done() and not timed_out:
        waiter = loop.create_future()

        def wake(_: object = None, *, waiter: asyncio.Future[None] = waiter) -> None:
            if not waiter.done():
                waiter.set_result(None)

        def time_out(waiter: asyncio.Future[None] = waiter) -> None:
            nonlocal timed_out
            timed_out = True
            wake(waiter=waiter)

        pending.add_done_callback(wake)
        timer = loop.call_at(until, time_out)
        waiter._asyncio_future_blocking = True  # what `await waiter` would set
        try:
            yield waiter
        except asyncio.CancelledError:
            pending.cancel()
        finally:
            timer.cancel()
            pending.remove_done_callback(wake)
    if pending.done():
        return True
    pending._asyncio_future_blocking = True  # as its __await__ left it, for _resume to yield
    return False


@types.coroutine
def _resume(steps: _Steps, pending: Any) -> Generator[Any, None, None]:
    """Continue a handler, suspended on *pending*, to its end; what it raises is dropped
    (its failure was written already; SystemExit raised out of a task would stop the loop)."""
    while True:
        try:
            yield pending
            step = partial(steps.send, None)
        except GeneratorExit:
            steps.close()
            return
        except BaseException as exc:
            step = partial(steps.throw, exc)
        try:
            pending = step()
        except BaseException:
            return


async def outlive(rest: Rest) -> None:
    """The rest of a handler that outlived its grace, run to its end (an orphan's task)."""
    await _resume(*rest)
