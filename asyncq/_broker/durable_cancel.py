"""Cancelling a durable run (the Inspector): ``lua/durable_cancel.lua``.

A run whose task is pending, waiting (scheduled) or retrying is archived with a
cancellation error and its record marked ``cancelled`` in one script; a run whose
attempt is active is marked there and its attempt stopped through Pub/Sub by the
caller. Nothing recorded is removed.
"""

from __future__ import annotations

from typing import cast

from redis.exceptions import ResponseError

from asyncq import _keys as keys
from asyncq._broker._base import ARCHIVE_MAX_SIZE, ARCHIVED_EXPIRATION, LUA_PACKAGE
from asyncq._redis.options import RedisClient
from asyncq._redis.scripts import load_script
from asyncq.errors import BrokerError

__all__ = ["CANCELED_ERROR", "cancel_run"]

CANCELED_ERROR = "context canceled: durable run cancelled"
"""The error a cancelled run's archived task carries."""

_CANCEL = load_script(LUA_PACKAGE, "durable_cancel")


async def cancel_run(
    redis: RedisClient,
    qname: str,
    run_id: str,
    *,
    task_state: str,
    archived_msg: bytes,
    signal: tuple[str, str, int] | None,
    expire_in: int,
    now: float,
) -> str:
    """Run the cancel script for the run *run_id* of *qname* whose task was read in
    *task_state* ("" when gone), *archived_msg* its message to archive; *signal* the
    name, key and index of the signal wait it sits in; the record expires *expire_in*
    seconds after. The script's answer: the run's state before, ``gone`` or ``moved``."""
    # Without a signal wait the script touches no waiting-runs set; it still checks
    # the one it is given, so it gets one of the queue's (never written).
    name, key, index = signal if signal is not None else ("", "", -1)
    member = f"{run_id} {index}" if signal is not None else ""
    now_s = int(now)
    try:
        reply = await _CANCEL(
            redis,
            (
                keys.run_key(qname, run_id), keys.task_key(qname, run_id),
                keys.archived_key(qname), keys.awaiting_key(qname, name, key),
                keys.pending_key(qname), keys.scheduled_key(qname), keys.retry_key(qname),
            ),
            (
                run_id, now_s, archived_msg, expire_in, task_state, member,
                now_s - ARCHIVED_EXPIRATION, ARCHIVE_MAX_SIZE, keys.task_key_prefix(qname),
            ),
        )  # fmt: skip
    except ResponseError as exc:
        raise BrokerError(f"Redis script durable_cancel failed: {exc}") from exc
    return cast(bytes, reply).decode()
