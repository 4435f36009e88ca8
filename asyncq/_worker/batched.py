"""The processor's coalesced calls: acknowledgements, type tokens and inline steps' starts,
one call per turn.

All three are :class:`~asyncq._batch.TurnBatcher` users whose sends are tasks of the
processor's TaskGroup (leaving ``Processor.run()`` waits for every call in flight)
and whose callers each wait for their own answer, a future resolved by the send.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from asyncq._batch import Spawn, TurnBatcher
from asyncq._broker.durable import Recorded, SuspendPlan
from asyncq._broker.processing import DequeuedTask
from asyncq._worker.limits import TYPE_RATE_MAX_WAIT_US, Rate
from asyncq.proto.asynq import TaskMessage

if TYPE_CHECKING:
    from asyncq._worker.broker import WorkerBroker

__all__ = ["AckBatcher", "InlineStarts", "TypeTokens"]

_Acked = BaseException | DequeuedTask | Recorded | None
"""An acknowledgement's answer: None, the task's error, the run a durable step woke here,
or what an inline step recorded in its run."""
_Ack = tuple[TaskMessage, bool, "asyncio.Future[_Acked]"]
_Token = tuple[str, Rate, "asyncio.Future[tuple[bool, int]]"]
_Started = tuple[str, float]
"""An inline step's start: its answer (``here``, or why not) and the lease expiry written."""
_Start = tuple[str, str, SuspendPlan, "asyncio.Future[_Started]"]


class AckBatcher:
    """Coalesces the successes finished in one event-loop turn into one ``ack_many`` call.

    Workflow steps' successes included: the broker acknowledges each with its
    workflow's bookkeeping and hand-off in the same script call.

    Each worker still waits for its own acknowledgement (its slot and lease are
    held until the task is written), so the semantics are those of one
    Done/MarkAsComplete per task, at a fraction of the round trips under load.
    A durable step's acknowledgement may answer with the run it woke, which then
    continues in the step's slot (*runs_here* says of which queues); an inline step's
    with the result it recorded in its run, whose attempt awaits it.
    """

    __slots__ = ("_batch", "_broker", "_inline", "_runs_here", "_slots")

    def __init__(
        self,
        broker: WorkerBroker,
        slots: asyncio.Semaphore,
        spawn: Spawn,
        runs_here: Callable[[str], bool] | None = None,
    ) -> None:
        self._broker = broker
        self._slots = slots  # the processor's bound on writes in flight
        self._runs_here = runs_here
        self._inline: dict[str, bytes | None] = {}
        """The inline steps among the acknowledgements not sent yet: id -> result held."""
        self._batch: TurnBatcher[_Ack] = TurnBatcher(self._send, spawn=spawn)

    def ack(
        self, msg: TaskMessage, complete: bool, inline: bool = False, held: bytes | None = None
    ) -> asyncio.Future[_Acked]:
        """A future resolving to None when acknowledged, or to the task's error, or (a
        durable step) to the run it woke, leased to this worker, or (an *inline* step,
        whose result *held* is written with it) to what it recorded."""
        fut: asyncio.Future[_Acked] = asyncio.get_running_loop().create_future()
        if inline:
            self._inline[msg.id] = held
        self._batch.add((msg, complete, fut))
        return fut

    async def _send(self, batch: list[_Ack]) -> None:
        inline = None
        if self._inline:  # this batch's (the next one's may be there too)
            held = self._inline
            inline = {m.id: held.pop(m.id) for m, _, _ in batch if m.id in held}
        try:
            async with self._slots:
                results: Sequence[_Acked] = await self._broker.ack_many(
                    [(msg, complete) for msg, complete, _ in batch],
                    runs_here=self._runs_here,
                    inline=inline,
                )
        except Exception as exc:  # e.g. connection lost: every task of the batch gets it
            results = [exc] * len(batch)
        except BaseException:
            for _, _, fut in batch:
                fut.cancel()
            raise
        for (_, _, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)
            elif isinstance(result, DequeuedTask):
                # Its step's coroutine is gone (cancelled with the loop): the run it woke,
                # leased to us, goes back to pending; if that fails too, the recoverer
                # moves it on once its lease expires.
                with contextlib.suppress(Exception):
                    await self._broker.requeue(result.message)


class TypeTokens:
    """Coalesces the token requests of one event-loop turn into one script call per type.

    The tasks of one fetch start in the same turn and each asks for a token
    before its handler, so a fetch of 50 tasks of a rate-limited type costs one
    call, not 50. The first requests get the tokens taken, in order; the rest
    get "no token" with the wait until the next one.
    """

    __slots__ = ("_batch", "_broker")

    def __init__(self, broker: WorkerBroker, spawn: Spawn) -> None:
        self._broker = broker
        self._batch: TurnBatcher[_Token] = TurnBatcher(self._send, spawn=spawn)

    def take(self, task_type: str, rate: Rate) -> asyncio.Future[tuple[bool, int]]:
        """A future resolving to ``(True, wait µs)`` for a token or ``(False, wait µs)``."""
        fut: asyncio.Future[tuple[bool, int]] = asyncio.get_running_loop().create_future()
        self._batch.add((task_type, rate, fut))
        return fut

    async def _send(self, batch: list[_Token]) -> None:
        by_type: dict[str, tuple[Rate, list[asyncio.Future[tuple[bool, int]]]]] = {}
        for task_type, rate, fut in batch:
            by_type.setdefault(task_type, (rate, []))[1].append(fut)
        # One call per type, side by side; this send (a task of the processor's group)
        # waits for them all.
        await asyncio.gather(*(self._take(t, rate, futs) for t, (rate, futs) in by_type.items()))

    async def _take(
        self, task_type: str, rate: Rate, futs: list[asyncio.Future[tuple[bool, int]]]
    ) -> None:
        try:
            waits, next_wait = await self._broker.take_type_tokens(
                task_type,
                len(futs),
                interval_us=rate.interval_us,
                burst=rate.burst,
                max_wait_us=TYPE_RATE_MAX_WAIT_US,
            )
        except Exception as exc:  # e.g. connection lost: every request of the batch gets it
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except BaseException:
            for fut in futs:
                fut.cancel()
            raise
        for i, fut in enumerate(futs):
            if not fut.done():  # a cancelled waiter's token is lost: the rate only errs low
                fut.set_result((True, waits[i]) if i < len(waits) else (False, next_wait))


class InlineStarts:
    """Coalesces the inline steps the attempts of durable runs start in one event-loop
    turn into one script call per queue (:meth:`~asyncq._worker.attempt.Attempts.run_inline`).

    The attempts a fetch started reach their first step in the same turn, and so do
    those whose steps' acknowledgements came in one batch: a worker running 50 runs
    starts their steps in a few calls, not 50.
    """

    __slots__ = ("_batch", "_broker")

    def __init__(self, broker: WorkerBroker, spawn: Spawn) -> None:
        self._broker = broker
        self._batch: TurnBatcher[_Start] = TurnBatcher(self._send, spawn=spawn)

    def start(self, qname: str, run_id: str, plan: SuspendPlan) -> asyncio.Future[_Started]:
        """A future resolving to the step's answer and its lease's expiry (unix s)."""
        fut: asyncio.Future[_Started] = asyncio.get_running_loop().create_future()
        self._batch.add((qname, run_id, plan, fut))
        return fut

    async def _send(self, batch: list[_Start]) -> None:
        by_queue: dict[str, list[_Start]] = {}
        for item in batch:
            by_queue.setdefault(item[0], []).append(item)
        await asyncio.gather(*(self._start(q, items) for q, items in by_queue.items()))

    async def _start(self, qname: str, items: list[_Start]) -> None:
        broker = self._broker
        expiry = broker.clock() + broker.lease_duration
        try:
            answers = await broker.start_inline_steps(
                qname, [(run_id, plan) for _, run_id, plan, _ in items], expiry
            )
        except Exception as exc:  # e.g. connection lost: every start of the call gets it
            for *_, fut in items:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except BaseException:
            for *_, fut in items:
                fut.cancel()
            raise
        for (_, _, plan, fut), answer in zip(items, answers, strict=True):
            if not fut.done():
                fut.set_result((answer, expiry))
            elif answer == "here":
                # Its attempt is gone (cancelled with the loop): the step leased to us goes
                # back to pending; if that fails too, the recoverer moves it on once its
                # lease expires.
                with contextlib.suppress(Exception):
                    await broker.requeue(plan.steps[0][1])
