"""Per-task-type rate limits: one fleet-wide GCRA bucket per type (``type_rate.lua``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncq import _keys as keys
from asyncq._broker._base import LUA_PACKAGE
from asyncq._redis.scripts import load_script

if TYPE_CHECKING:
    from asyncq._broker.broker import Broker

__all__ = ["take_type_token"]

_TYPE_RATE = load_script(LUA_PACKAGE, "type_rate")


async def take_type_token(
    broker: Broker, task_type: str, *, interval_us: int, burst: int, max_wait_us: int
) -> tuple[bool, int]:
    """Take a token of *task_type*'s bucket: ``(True, wait µs)`` when taken for now + wait
    (wait <= *max_wait_us*), ``(False, wait µs)`` when none comes within *max_wait_us*."""
    granted, wait = await _TYPE_RATE(
        broker._cmd, (keys.type_rate_key(task_type),), (interval_us, burst, max_wait_us)
    )
    return int(granted) == 1, int(wait)
