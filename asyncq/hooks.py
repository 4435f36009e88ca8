"""Worker hooks: what a server tells an observer (metrics) about its work.

A ``Server(metrics=...)`` object implements :class:`WorkerHooks`;
:class:`asyncq.metrics.WorkerMetrics` is the Prometheus implementation. The
server wraps its handler with :meth:`WorkerHooks.instrument` (duration, in-flight
and outcome per task), calls :meth:`attach` when it starts and :meth:`detach`
when it has shut down, and the processor reports retries, archives and lease
expiries, which only the processor decides. :func:`combine_hooks` makes several
observers one. The server's metrics history is not one of them: the processor counts
it where it decides each outcome (:class:`asyncq.history.HistoryRecorder`), which
costs less per task than a handler wrapper.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from asyncq.mux import Handler

__all__ = ["NO_HOOKS", "CombinedHooks", "NoWorkerHooks", "WorkerHooks", "combine_hooks"]


@runtime_checkable
class WorkerHooks(Protocol):
    """Observer of a worker server. Every method must be cheap and must not raise."""

    def instrument(self, handler: Handler) -> Handler:
        """Return *handler* wrapped to observe each call (duration, in-flight, outcome)."""
        ...

    def attach(self) -> None:
        """The server started (called inside its event loop)."""
        ...

    def detach(self) -> None:
        """The server has shut down."""
        ...

    def task_retried(self, queue: str, task_type: str) -> None:
        """A failed task was scheduled for another attempt."""
        ...

    def task_archived(self, queue: str, task_type: str) -> None:
        """A failed task ran out of retries (or skipped them) and was archived."""
        ...

    def lease_expired(self, queue: str, task_type: str) -> None:
        """A task's lease expired while this server ran it (its outcome is not written)."""
        ...

    def loop_stalled(self, seconds: float) -> None:
        """The event loop was blocked for *seconds* (beyond the stall threshold)."""
        ...

    def task_finished(
        self,
        queue: str,
        task_type: str,
        task_id: str,
        outcome: str,
        *,
        error: str,
        exc: BaseException | None,
    ) -> None:
        """An attempt's outcome is decided and about to be written.

        *outcome*: ``done``, ``complete``, ``revoke``, ``retry``, ``archive``,
        ``suspend`` (a durable run waits, asyncq/durable.py) or ``lost`` (the lease ran
        out: nothing written); *error* the error
        message stored with a retry or archive; *exc* what the handler raised.
        """
        ...


class NoWorkerHooks:
    """The hooks of a server without an observer: every call does nothing.

    The server and its roles always call their hooks; this default keeps them
    free of ``if metrics is not None`` checks, and its :meth:`instrument`
    returns the handler itself, so an unobserved server pays nothing per task.
    """

    def instrument(self, handler: Handler) -> Handler:
        return handler

    def attach(self) -> None:
        return None

    def detach(self) -> None:
        return None

    def task_retried(self, queue: str, task_type: str) -> None:
        return None

    def task_archived(self, queue: str, task_type: str) -> None:
        return None

    def lease_expired(self, queue: str, task_type: str) -> None:
        return None

    def loop_stalled(self, seconds: float) -> None:
        return None

    def task_finished(
        self,
        queue: str,
        task_type: str,
        task_id: str,
        outcome: str,
        *,
        error: str,
        exc: BaseException | None,
    ) -> None:
        return None


NO_HOOKS: WorkerHooks = NoWorkerHooks()
"""The shared do-nothing hooks (the default of a server without ``metrics``)."""


class CombinedHooks:
    """Several hooks called as one, in order; the first one's wrapper is the outermost."""

    __slots__ = ("hooks",)

    def __init__(self, hooks: Sequence[WorkerHooks]) -> None:
        self.hooks = tuple(hooks)

    def instrument(self, handler: Handler) -> Handler:
        for hooks in reversed(self.hooks):
            handler = hooks.instrument(handler)
        return handler

    def attach(self) -> None:
        for hooks in self.hooks:
            hooks.attach()

    def detach(self) -> None:
        for hooks in self.hooks:
            hooks.detach()

    def task_retried(self, queue: str, task_type: str) -> None:
        for hooks in self.hooks:
            hooks.task_retried(queue, task_type)

    def task_archived(self, queue: str, task_type: str) -> None:
        for hooks in self.hooks:
            hooks.task_archived(queue, task_type)

    def lease_expired(self, queue: str, task_type: str) -> None:
        for hooks in self.hooks:
            hooks.lease_expired(queue, task_type)

    def loop_stalled(self, seconds: float) -> None:
        for hooks in self.hooks:
            hooks.loop_stalled(seconds)

    def task_finished(
        self,
        queue: str,
        task_type: str,
        task_id: str,
        outcome: str,
        *,
        error: str,
        exc: BaseException | None,
    ) -> None:
        for hooks in self.hooks:
            hooks.task_finished(queue, task_type, task_id, outcome, error=error, exc=exc)


def combine_hooks(*hooks: WorkerHooks | None) -> WorkerHooks:
    """One :class:`WorkerHooks` calling each of *hooks* (None entries are left out):
    :data:`NO_HOOKS` for none, the hooks themselves for one."""
    present = [h for h in hooks if h is not None and h is not NO_HOOKS]
    if not present:
        return NO_HOOKS
    if len(present) == 1:
        return present[0]
    return CombinedHooks(present)
