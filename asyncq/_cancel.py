"""Honouring a cancellation that Python 3.11's ``asyncio.wait_for`` swallowed."""

from __future__ import annotations

import asyncio


def raise_if_cancelling() -> None:
    """Raise CancelledError when the current task has a cancellation request pending.

    Python 3.11's ``asyncio.wait_for``, which redis-py sends and reads through, swallows a
    cancellation that lands as its awaitable finishes (fixed in 3.12): the request is
    still counted on the task, but the awaiting code goes on. A loop that awaits Redis
    without end calls this after each such await, so that a cancel always ends it.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
