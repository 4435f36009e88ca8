"""The history role: writes the metrics history the processor counted.

The processor counts each outcome in memory (:class:`asyncq.history.HistoryRecorder`);
this role writes those counts every ``flush_interval`` (5 s) and once more at
shutdown, after the processor has stopped, so the last tasks' runs are in Redis
before the worker exits. Only present when the server keeps a metrics history.
"""

from __future__ import annotations

from typing import ClassVar

from asyncq._worker.roles import PeriodicRole, RoleDeps
from asyncq.history import HistoryRecorder

__all__ = ["HistoryFlusher"]


class HistoryFlusher(PeriodicRole):
    """Flushes a :class:`HistoryRecorder` periodically and at shutdown."""

    name: ClassVar[str] = "history"
    run_at_start: ClassVar[bool] = False  # nothing is counted before the first interval

    def __init__(self, deps: RoleDeps, *, recorder: HistoryRecorder) -> None:
        super().__init__(deps, recorder.flush_interval.total_seconds())
        self.recorder = recorder

    async def tick(self) -> None:
        await self.recorder.flush()

    async def cleanup(self) -> None:
        await self.recorder.flush()
