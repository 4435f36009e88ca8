"""Worker lifespan: state opened once per worker process and seen by every handler.

``Server(lifespan=...)`` takes a zero-argument callable returning an async
context manager (e.g. an ``@asynccontextmanager`` function). The server
enters it when it starts, before fetching the first task, and exits it after
the last handler finished at shutdown. What it yields is the *lifespan
state*; handlers read it with :func:`lifespan_state` (or, for an
:class:`~asyncq.App`, the typed ``app.state``).

The state lives in a context variable set only in the server's own tasks, so
two servers in one process (tests) each see their own state and the code that
started the server does not see it at all.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeAlias

__all__ = ["Lifespan", "lifespan_state"]

Lifespan: TypeAlias = Callable[[], AbstractAsyncContextManager[Any]]
"""A zero-argument callable returning an async context manager; what it yields is the state."""

_NO_STATE = object()

state_var: contextvars.ContextVar[object] = contextvars.ContextVar(
    "asyncq_lifespan_state", default=_NO_STATE
)
"""Set by the server (and an App's eager mode) for the tasks it runs."""


def lifespan_state() -> Any:
    """The state the running worker's lifespan yielded.

    Raises RuntimeError outside a worker started with a lifespan (or an
    App's eager block), naming the problem instead of returning None.
    """
    state = state_var.get()
    if state is _NO_STATE:
        raise RuntimeError(
            "no lifespan state here: it is available in handlers run by a Server "
            "started with lifespan=... (or inside App.eager())"
        )
    return state
