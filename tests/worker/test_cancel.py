"""A cancellation swallowed on the way (as Python 3.11's asyncio.wait_for can) still ends
the loops that check for it."""

from __future__ import annotations

import asyncio

import pytest

from asyncq._cancel import raise_if_cancelling


async def test_a_swallowed_cancel_is_raised_again() -> None:
    reached: list[str] = []

    async def loop() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        try:  # what 3.11's wait_for does when the cancel lands as its awaitable finishes
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            reached.append("swallowed")
        raise_if_cancelling()
        reached.append("went on")

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(loop())
    assert reached == ["swallowed"]


async def test_nothing_pending_goes_on() -> None:
    raise_if_cancelling()  # no cancel requested: returns
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
