"""Per-task-type rate limits: one fleet-wide GCRA bucket per type (``type_rate.lua``)."""

from __future__ import annotations

from asyncq import _keys as keys
from asyncq._broker._base import LUA_PACKAGE, BrokerBase
from asyncq._logging import LazyLogger
from asyncq._redis.scripts import load_script

__all__ = ["take_type_tokens"]

_TYPE_RATE = load_script(LUA_PACKAGE, "type_rate")
_log = LazyLogger()


async def take_type_tokens(
    broker: BrokerBase,
    task_type: str,
    count: int,
    *,
    interval_us: int,
    burst: int,
    max_wait_us: int,
) -> tuple[list[int], int]:
    """Take up to *count* tokens of *task_type*'s bucket in one script call.

    Returns the waits (µs from now) of the tokens taken, each at most
    *max_wait_us*, and, when fewer than *count* were taken, the wait until the
    next token (else 0).
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    key = keys.type_rate_key(task_type)
    res = list(await _TYPE_RATE(broker._cmd, (key,), (interval_us, burst, max_wait_us, count)))
    if res and isinstance(res[-1], bytes | str):
        # The script replaced a stored value no worker writes (it would have refused
        # every task of the type for good): named once, where it was met.
        bad = res.pop()
        _log.warning(
            "reset an unreadable asyncq rate bucket value",
            key=key,
            value=bad.decode("utf-8", "replace") if isinstance(bad, bytes) else bad,
        )
    n = int(res[0])
    waits = [int(w) for w in res[1 : 1 + n]]
    return waits, int(res[1 + n]) if len(res) > 1 + n else 0
