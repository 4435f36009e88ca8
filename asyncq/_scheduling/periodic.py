"""PeriodicTaskManager: keeps a Scheduler's entries in step with a config provider.

Like asynq's PeriodicTaskManager it asks a provider for the wanted periodic
tasks every ``sync_interval`` (3 min by default), compares them with what is
registered by a hash of (cron spec, task type, payload, options), registers
the new ones and unregisters the ones that are gone. A round in which the
provider fails or any config is invalid changes nothing: it is logged as an
error naming the bad config and the last good set keeps running. The first
sync, in :meth:`PeriodicTaskManager.start`, must succeed.

Because the underlying Scheduler enqueues each tick once across processes,
several managers reading the same provider can run side by side for
availability.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeAlias, Unpack

from anyio.abc import TaskStatus

from asyncq._logging import get_logger
from asyncq._redis.options import RedisTarget
from asyncq._scheduling.cron import parse_cronspec
from asyncq._scheduling.scheduler import Scheduler, SchedulerOptions, entry_identity
from asyncq._service import Service
from asyncq.task import Task

__all__ = ["ConfigProvider", "PeriodicTaskConfig", "PeriodicTaskManager", "SyncResult"]


@dataclass(frozen=True, slots=True)
class PeriodicTaskConfig:
    """One periodic task: enqueue *task* with *options* on every tick of *cronspec*."""

    cronspec: str
    task: Task
    options: Mapping[str, Any] = field(default_factory=dict)


ConfigProvider: TypeAlias = Callable[
    [], Iterable[PeriodicTaskConfig] | Awaitable[Iterable[PeriodicTaskConfig]]
]
"""A sync or async callable returning the periodic tasks that should be registered."""


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What one sync round changed: entry IDs registered and unregistered."""

    added: list[str]
    removed: list[str]


class PeriodicTaskManager(Service):
    """Registers and unregisters a Scheduler's entries from a provider, every ``sync_interval``.

    ``redis`` and the keyword options after ``sync_interval`` are the
    :class:`~asyncq._scheduling.scheduler.Scheduler`'s (``location``, ``heartbeat_interval``,
    hooks, ``claim_lease``, ``misfire_grace``).
    """

    def __init__(
        self,
        redis: RedisTarget,
        provider: ConfigProvider,
        *,
        sync_interval: timedelta = timedelta(minutes=3),
        **scheduler_options: Unpack[SchedulerOptions],
    ) -> None:
        if not callable(provider):
            raise TypeError("provider must be a callable returning PeriodicTaskConfig items")
        if not isinstance(sync_interval, timedelta):
            raise TypeError(
                f"sync_interval must be a timedelta, got {sync_interval.__class__.__name__}"
            )
        if sync_interval <= timedelta(0):
            raise ValueError(f"sync_interval must be positive, got {sync_interval}")
        super().__init__()
        self.provider = provider
        self.sync_interval = sync_interval
        self.scheduler = Scheduler(redis, **scheduler_options)
        self.log: Any = get_logger(scheduler_id=self.scheduler.id)
        self._by_hash: dict[str, str] = {}  # config hash -> entry ID
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()

    @property
    def entries(self) -> dict[str, str]:
        """Registered configs: config hash -> entry ID."""
        return dict(self._by_hash)

    async def sync(self) -> SyncResult:
        """Load the configs now and apply the difference.

        Raises (and changes nothing) when the provider fails or a config is invalid.
        """
        async with self._lock:
            wanted = await self._load()
            removed = [h for h in self._by_hash if h not in wanted]
            added = [h for h in wanted if h not in self._by_hash]
            removed_ids: list[str] = []
            for config_hash in removed:
                entry_id = self._by_hash.pop(config_hash)
                self.scheduler.unregister(entry_id)
                removed_ids.append(entry_id)
            added_ids: list[str] = []
            for config_hash in added:
                config = wanted[config_hash]
                entry_id = self.scheduler.register(
                    config.cronspec, config.task, **dict(config.options)
                )
                self._by_hash[config_hash] = entry_id
                added_ids.append(entry_id)
            if added_ids or removed_ids:
                self.log.info(
                    "periodic tasks synced",
                    added=len(added_ids),
                    removed=len(removed_ids),
                    total=len(self._by_hash),
                )
            return SyncResult(added=added_ids, removed=removed_ids)

    async def _load(self) -> dict[str, PeriodicTaskConfig]:
        result = self.provider()
        configs = await result if inspect.isawaitable(result) else result
        if isinstance(configs, PeriodicTaskConfig) or not isinstance(configs, Iterable):
            raise TypeError(
                "the periodic task provider must return an iterable of PeriodicTaskConfig, "
                f"got {configs.__class__.__name__}"
            )
        wanted: dict[str, PeriodicTaskConfig] = {}
        for index, config in enumerate(configs):
            if not isinstance(config, PeriodicTaskConfig):
                raise TypeError(
                    f"periodic task config #{index} is a {config.__class__.__name__}, "
                    "not a PeriodicTaskConfig"
                )
            try:
                if not isinstance(config.options, Mapping):
                    raise TypeError(
                        f"options must be a mapping, got {config.options.__class__.__name__}"
                    )
                parse_cronspec(config.cronspec, self.scheduler.location)
                config_hash = entry_identity(config.cronspec, config.task, config.options)
            except (ValueError, TypeError) as exc:
                task_type = getattr(config.task, "type", config.task)
                raise ValueError(
                    f"invalid periodic task config #{index} "
                    f"(cronspec={config.cronspec!r}, task={task_type!r}): {exc}"
                ) from exc
            if config_hash in wanted:
                self.log.warning(
                    "duplicate periodic task config ignored",
                    index=index,
                    cronspec=config.cronspec,
                    task_type=config.task.type,
                )
                continue
            wanted[config_hash] = config
        return wanted

    kind = "periodic task manager"

    async def start(self) -> None:
        """Run the first sync (raising if it fails), start the scheduler and the sync loop."""
        await self._start_service()

    async def _open(self) -> None:
        await self.sync()
        await self.scheduler.start()

    async def _main_loop(self, task_status: TaskStatus[None]) -> None:
        """The manager's main task: the sync loop (the scheduler runs its own). It serves
        at once: the first sync ran in :meth:`_open`."""
        task_status.started()
        await self._sync_loop()

    async def _close(self) -> None:
        self._stop.set()
        if self._main is not None:
            self._main.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._main
        await self.scheduler.shutdown()

    async def _release(self) -> None:
        await self.scheduler.shutdown()

    async def shutdown(self) -> None:
        """Stop syncing and shut the scheduler down."""
        await super().shutdown()

    async def run(self) -> None:
        """Start, run until SIGTERM or SIGINT, then shut down (a second signal ends the
        process)."""
        await self._run_until_signal(self.start)

    async def _sync_loop(self) -> None:
        interval = self.sync_interval.total_seconds()
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval)
            if self._stop.is_set():
                return
            try:
                await self.sync()
            except Exception as exc:
                self.log.error(
                    "periodic task sync failed; keeping the last good set",
                    error=f"{exc.__class__.__name__}: {exc}",
                    registered=len(self._by_hash),
                )

    async def __aenter__(self) -> PeriodicTaskManager:
        await self.start()
        return self
