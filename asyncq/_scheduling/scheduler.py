"""The Scheduler: enqueues registered tasks on cron ticks, exactly once across processes.

It writes what asynq's scheduler writes, so ``asynq cron ls``, ``asynq cron
history`` and asynqmon show asyncq schedulers: a heartbeat of SchedulerEntry
records under ``asynq:schedulers:{<host>:<pid>:<uuid>}`` (TTL 2 x heartbeat
interval) and a SchedulerEnqueueEvent per enqueued task under
``asynq:scheduler_history:<entry id>`` (newest 1,000 kept).

Exactly once across schedulers
------------------------------
asynq enqueues every tick once *per scheduler process*, so two schedulers with
the same entries double every task. asyncq schedulers sharing entries
cooperate through Redis instead (no leader, so no fail-over gap):

* An entry's **identity** is a SHA-256 over its normalised cron spec, task type,
  payload, sorted option strings and task headers (:func:`entry_identity`), the
  same in every process, unlike the per-process entry ID.
* Tick times come from the spec alone (``@every`` ticks are aligned to the
  Unix epoch), so all schedulers agree on them whatever their start time or
  clock skew.
* For each tick every scheduler claims :func:`asyncq._keys.scheduler_claim_key`
  ``(identity, tick)``, setting it to ``<scheduler id>/<entry id>`` with a PX of
  ``claim_lease`` if it is missing (``scheduler_claim.lua``). The winner runs the
  pre-enqueue hook, checks it still holds the claim, enqueues, then overwrites
  the claim with ``done:<scheduler id>:<task id>`` (kept for
  ``misfire_grace`` + ``claim_lease`` + 10 min, longer than any sane clock skew).
  The losers wait for the claim's lease to run out; a ``done`` claim ends their
  work, an expired one (the winner died) lets one of them take the tick over.
  What no scheduler writes there (another Redis type, a value with no expiry or
  of no claim's shape) would hold the tick past its grace: it is replaced at
  once and named in a warning with its key (the derived task ID below still
  stops a second enqueue).
* Unless the options carry an explicit ``task_id``, the task ID is derived from
  (identity, tick) (:func:`tick_task_id`, a UUIDv5). A scheduler that takes over
  a tick whose first claimant did enqueue before dying, or that retries after a
  lost reply, gets TaskIdConflictError and knows the tick is already done.

Guarantee: while Redis keeps its data and at least one scheduler with the
entry runs, each tick is enqueued once, at most ``claim_lease`` late after a
claimant dies, and is given up (logged as an error and passed to the error
handler) only when no scheduler could reach Redis for ``misfire_grace`` after
the tick. One window remains: a scheduler that dies between its enqueue and
the ``done`` write (one round trip), whose task is then processed and deleted
(no ``retention``) before ``claim_lease`` runs out, lets a second scheduler
enqueue that tick again. A ``retention`` longer than ``claim_lease`` closes it.

Shared entries (``Scheduler(shared=True)``, what an App's workers run for
``@app.cron``): every worker process runs the same entries, so besides the
claims above

* an entry's ID is derived from its identity (a UUIDv5), the same in every
  process, and so is its history (``asynq:scheduler_history:<entry id>``),
  which is kept when a scheduler stops (others still run the entry; asynq caps
  it at 1,000 events);
* only the scheduler holding the entry's listing lease
  (:func:`asyncq._keys.scheduler_lister_key`, renewed with each heartbeat and
  expiring after two) writes the entry in its heartbeat record, so ``asyncq
  cron ls``, the web UI, asynqmon and Go's ``asynq cron ls`` list it once; when
  that scheduler stops it hands the lease back, and another one lists the entry
  from its next heartbeat. A lease of another type or with no expiry, which would
  hide the entry from every listing for good, is replaced and named in a warning.

Other differences from asynq, on purpose:

* the first heartbeat is written at :meth:`Scheduler.start` (asynq waits one
  interval, so a new scheduler is invisible for 10 s), and again right after
  each ``register``/``unregister`` while running and after each tick (so the
  listed previous and next runs are current at once, not up to an interval late);
* ``unregister`` also deletes the entry's history once its in-flight ticks are
  done (asynq only deletes histories at shutdown and leaks the others);
* the pre/post hooks run in the scheduler that enqueues the tick only;
* registering an entry identical to one already registered in the same
  scheduler is logged as a warning: its ticks share claims, so it adds no
  enqueues.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, TypeAlias, TypedDict, Unpack

from anyio.abc import TaskStatus

from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._gofmt import option_strings
from asyncq._logging import Backoff, RateLimiter, get_logger, is_debug_enabled
from asyncq._producer.client import Client
from asyncq._producer.compose import compose
from asyncq._redis.connection import Connection
from asyncq._redis.errors import REDIS_ERRORS
from asyncq._redis.options import RedisTarget
from asyncq._scheduling.cron import Schedule, normalize_spec, parse_cronspec
from asyncq._scheduling.roles import EntryTicker, SchedulerHeartbeat, next_tick
from asyncq._service import Service
from asyncq._supervision import supervise
from asyncq._taskstart import start_task
from asyncq._time import GO_ZERO_TIME
from asyncq.errors import AsyncqError, TaskIdConflictError
from asyncq.proto.asynq import SchedulerEnqueueEvent as SchedulerEnqueueEventProto
from asyncq.proto.asynq import SchedulerEntry as SchedulerEntryProto
from asyncq.task import EnqueueOptions, Task, TaskInfo

__all__ = [
    "EntryNotFoundError",
    "ErrorHandler",
    "PostEnqueueHook",
    "PreEnqueueHook",
    "Scheduler",
    "SchedulerOptions",
    "entry_identity",
    "tick_jitter",
    "tick_task_id",
    "validate_options",
]

PreEnqueueHook: TypeAlias = Callable[[Task, dict[str, Any]], Awaitable[None] | None]
"""Called with (task, options) right before the scheduler enqueues a tick."""
PostEnqueueHook: TypeAlias = Callable[
    [TaskInfo | None, BaseException | None], Awaitable[None] | None
]
"""Called with (info, None) after an enqueue, or (None, error) when it failed."""
ErrorHandler: TypeAlias = Callable[[Task, dict[str, Any], BaseException], Awaitable[None] | None]
"""Called with (task, options, error) when a tick could not be enqueued."""

_DONE_PREFIX = "done:"
# How long a finished claim outlives the grace window: it must exceed the clock
# skew between schedulers, or a lagging one could claim a finished tick again.
_DONE_MARGIN = timedelta(minutes=10)
# A fixed namespace, so every process derives the same task ID for a tick.
_TICK_NAMESPACE = uuid.UUID("2f0b7c8e-59a4-4d6e-9f3b-6a1c2d3e4f50")
_SHUTDOWN_TIMEOUT = 8.0
# Shared entries: the entry ID every process derives from the identity.
_ENTRY_NAMESPACE = uuid.UUID("8d7c1a52-3b0e-4f61-a9d4-0c5e2b7f9a13")


class EntryNotFoundError(AsyncqError, KeyError):
    """``unregister`` was given an entry ID this scheduler does not have."""

    def __init__(self, entry_id: str) -> None:
        self.entry_id = entry_id
        super().__init__(f"no scheduler entry with id {entry_id!r}")

    def __str__(self) -> str:
        return str(self.args[0])


def tick_task_id(identity: str, tick_unix: int) -> str:
    """The task ID every scheduler uses for one tick of one entry (a UUIDv5)."""
    return str(uuid.uuid5(_TICK_NAMESPACE, f"{identity}:{tick_unix}"))


def tick_jitter(identity: str, tick_unix: int, jitter: timedelta) -> timedelta:
    """How long after its tick an entry with *jitter* runs: the same in every process,
    spread evenly over ``[0, jitter)``."""
    span = jitter // timedelta(microseconds=1)
    digest = hashlib.sha256(f"{identity}:{tick_unix}".encode()).digest()
    return timedelta(microseconds=int.from_bytes(digest[:8], "big") % span)


def _merged_options(task: Task, options: Mapping[str, Any]) -> dict[str, Any]:
    """The task's default options overlaid with *options*, as ``Client.enqueue`` merges them."""
    merged: dict[str, Any] = {}
    for level in (task.options, options):
        given = {k: v for k, v in level.items() if v is not None}
        if "process_at" in given or "process_in" in given:
            merged.pop("process_at", None)
            merged.pop("process_in", None)
        merged.update(given)
    return merged


def validate_options(task: Task, options: Mapping[str, Any]) -> list[str]:
    """Check *options* for *task* exactly as ``Client.enqueue`` would; returns Go option strings.

    Raises ValueError or TypeError naming the bad option.
    """
    compose(task, [options], datetime.now(UTC))
    return option_strings(_merged_options(task, options))


def entry_identity(cronspec: str, task: Task, options: Mapping[str, Any]) -> str:
    """The stable identity of a periodic entry: hex SHA-256 of its spec, task and options.

    Like asynq's PeriodicTaskManager hash it covers the cron spec, task type,
    payload and sorted option strings (here the task's own default options
    merged with *options*), plus the task headers; each part is length-prefixed
    so different entries cannot collide by concatenation. Raises ValueError or
    TypeError when the options are invalid.
    """
    if not isinstance(task, Task):
        raise TypeError(f"expected an asyncq Task, got {task.__class__.__name__}")
    strings = sorted(validate_options(task, options))
    digest = hashlib.sha256()

    def part(data: bytes) -> None:
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)

    part(normalize_spec(cronspec).encode())
    part(task.type.encode())
    part(task.payload or b"")
    part(str(len(strings)).encode())
    for text in strings:
        part(text.encode())
    for key, value in sorted(task.headers.items()):
        part(key.encode())
        part(value.encode())
    return digest.hexdigest()


async def _call_hook(hook: Callable[..., Any], *args: Any) -> None:
    result = hook(*args)
    if inspect.isawaitable(result):
        await result


@dataclass(slots=True, eq=False)
class _Entry:
    id: str
    spec: str
    schedule: Schedule
    task: Task
    options: dict[str, Any]
    option_strings: list[str]
    identity: str
    jitter: timedelta | None = None
    next: datetime | None = None
    prev: datetime | None = None
    ticker: EntryTicker | None = None
    fires: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def queue(self) -> str:
        return str(_merged_options(self.task, self.options).get("queue") or "default")

    def proto(self) -> SchedulerEntryProto:
        return SchedulerEntryProto(
            id=self.id,
            spec=self.spec,
            task_type=self.task.type,
            task_payload=self.task.payload or b"",
            enqueue_options=list(self.option_strings),
            next_enqueue_time=(self.next or GO_ZERO_TIME).astimezone(UTC),
            prev_enqueue_time=(self.prev or GO_ZERO_TIME).astimezone(UTC),
        )


class SchedulerOptions(TypedDict, total=False):
    """The :class:`Scheduler`'s keyword options, for what builds one (PeriodicTaskManager):
    each has the meaning and default of the Scheduler's parameter of the same name."""

    location: tzinfo
    heartbeat_interval: timedelta
    pre_enqueue: PreEnqueueHook | None
    post_enqueue: PostEnqueueHook | None
    error_handler: ErrorHandler | None
    claim_lease: timedelta
    misfire_grace: timedelta
    shared: bool


class Scheduler(Service):
    """Enqueues registered tasks on cron ticks (asynq's Scheduler, exactly once across processes).

    ``redis`` is a URI (``redis://host:6379/0``), connection options or a
    redis-py asyncio client (which stays the caller's to close). ``location`` is
    the zone cron specs are read in unless they carry ``CRON_TZ=``.

    ``claim_lease`` bounds how late a tick is when the scheduler that claimed it
    dies; ``misfire_grace`` is how long after its time a tick may still be
    enqueued (Redis outages, dead claimants) before it is reported as missed.

    ``shared=True``: the same entries run in many processes (an App's
    workers); entry IDs and histories are shared and each entry is listed by
    one scheduler only (see the module docstring).
    """

    def __init__(
        self,
        redis: RedisTarget,
        *,
        location: tzinfo = UTC,
        heartbeat_interval: timedelta = timedelta(seconds=10),
        pre_enqueue: PreEnqueueHook | None = None,
        post_enqueue: PostEnqueueHook | None = None,
        error_handler: ErrorHandler | None = None,
        claim_lease: timedelta = timedelta(seconds=5),
        misfire_grace: timedelta = timedelta(seconds=60),
        shared: bool = False,
    ) -> None:
        if not isinstance(location, tzinfo):
            raise TypeError(f"location must be a tzinfo, got {location.__class__.__name__}")
        for name, value in (
            ("heartbeat_interval", heartbeat_interval),
            ("claim_lease", claim_lease),
            ("misfire_grace", misfire_grace),
        ):
            if not isinstance(value, timedelta):
                raise TypeError(f"{name} must be a timedelta, got {value.__class__.__name__}")
            if value <= timedelta(0):
                raise ValueError(f"{name} must be positive, got {value}")
        if claim_lease < timedelta(milliseconds=100):
            raise ValueError(f"claim_lease must be at least 100ms, got {claim_lease}")
        for name, hook in (
            ("pre_enqueue", pre_enqueue),
            ("post_enqueue", post_enqueue),
            ("error_handler", error_handler),
        ):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable")
        super().__init__()
        self._target = redis
        self.location = location
        self.heartbeat_interval = heartbeat_interval
        self.claim_lease = claim_lease
        self.misfire_grace = misfire_grace
        self.pre_enqueue = pre_enqueue
        self.post_enqueue = post_enqueue
        self.error_handler = error_handler
        self.shared = bool(shared)
        host = socket.gethostname() or "unknown-host"
        self.id = f"{host}:{os.getpid()}:{uuid.uuid4()}"
        """Scheduler ID as asynq spells it: ``<hostname>:<pid>:<uuid4>``."""
        self.log: Any = get_logger(scheduler_id=self.id)
        self._entries: dict[str, _Entry] = {}
        self._retired: dict[str, _Entry] = {}
        self._conn: Connection | None = None
        self._broker: Broker | None = None
        self._client: Client | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._stop = asyncio.Event()
        self._heartbeat_role = SchedulerHeartbeat(
            self.log, heartbeat_interval.total_seconds(), self._heartbeat
        )
        self._enqueuing: set[asyncio.Task[None]] = set()
        self._redis_errors = RateLimiter(3.0)

    # -- registration -----------------------------------------------------------------------

    def register(
        self,
        cronspec: str,
        task: Task,
        *,
        jitter: timedelta | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> str:
        """Enqueue *task* with *options* on every tick of *cronspec*; returns the entry ID.

        *jitter*: each tick's task runs a spread-out delay in ``[0, jitter)``
        after the tick (the same delay in every process; the task is enqueued
        at the tick, scheduled for then).

        Raises ValueError (naming the spec or option) or TypeError for bad input.
        """
        if self._state in ("stopping", "closed"):
            raise RuntimeError("the scheduler is shut down; create a new one")
        if not isinstance(task, Task):
            raise TypeError(f"expected an asyncq Task, got {task.__class__.__name__}")
        schedule = parse_cronspec(cronspec, self.location)
        identity = entry_identity(cronspec, task, options)
        strings = validate_options(task, options)
        if jitter is not None:
            if not isinstance(jitter, timedelta):
                raise TypeError(f"jitter must be a timedelta, got {jitter.__class__.__name__}")
            if jitter <= timedelta(0):
                raise ValueError(f"jitter must be positive, got {jitter}")
            if any(k in _merged_options(task, options) for k in ("process_at", "process_in")):
                raise ValueError("jitter cannot be combined with process_at or process_in")
            identity = hashlib.sha256(f"{identity}:jitter:{jitter}".encode()).hexdigest()
        entry_id = str(uuid.uuid4())
        if self.shared:
            entry_id = str(uuid.uuid5(_ENTRY_NAMESPACE, identity))
            if entry_id in self._entries:
                raise ValueError(
                    f"an identical entry ({cronspec!r}, {task.type!r}) is already registered"
                )
        entry = _Entry(
            id=entry_id,
            spec=cronspec,
            schedule=schedule,
            task=task,
            options=dict(options),
            option_strings=strings,
            identity=identity,
            jitter=jitter,
        )
        entry.next = next_tick(schedule, datetime.now(UTC))
        if any(e.identity == identity for e in self._entries.values()):
            self.log.warning(
                "identical scheduler entry already registered; its ticks are enqueued once",
                cronspec=cronspec,
                task_type=task.type,
            )
        self._entries[entry.id] = entry
        self.log.info(
            "registered periodic task",
            entry_id=entry.id,
            cronspec=cronspec,
            task_type=task.type,
            queue=entry.queue,
        )
        if self._state == "running":
            if self._tg is not None:  # else _main_loop, about to run, starts it
                self._start_ticker(entry)
            self._heartbeat_role.beat_now()
        return entry.id

    def unregister(self, entry_id: str) -> None:
        """Stop scheduling the entry; raises EntryNotFoundError (a KeyError) when unknown."""
        entry = self._entries.pop(entry_id, None)
        if entry is None:
            raise EntryNotFoundError(entry_id)
        self.log.info("unregistered periodic task", entry_id=entry_id, task_type=entry.task.type)
        self._retired[entry.id] = entry
        if entry.ticker is not None:
            entry.ticker.request_stop()
        if self._state == "running":
            if self._tg is not None:  # else its history is deleted at shutdown
                self._tg.create_task(
                    self._retire(entry), name=f"asyncq-scheduler-retire-{entry.id}"
                )
            self._heartbeat_role.beat_now()

    @property
    def entries(self) -> dict[str, tuple[str, Task, dict[str, Any]]]:
        """Registered entries: entry ID -> (cron spec, task, options)."""
        return {e.id: (e.spec, e.task, dict(e.options)) for e in self._entries.values()}

    # -- lifecycle --------------------------------------------------------------------------

    kind = "scheduler"

    async def start(self) -> None:
        """Connect, write the first heartbeat and start ticking (raises if Redis is unreachable)."""
        await self._start_service()
        self.log.info("scheduler started", entries=len(self._entries))

    async def _open(self) -> None:
        self._conn = Connection(self._target)
        self._broker = Broker(self._conn.redis, fast=self._conn.fast)
        self._client = Client(self._conn)
        now = datetime.now(UTC)
        for entry in self._entries.values():
            entry.next = next_tick(entry.schedule, now)
        await self._heartbeat()

    async def _release(self) -> None:
        await self._close_connection()

    async def shutdown(self) -> None:
        """Stop ticking, let running enqueues finish, remove entries and histories, close."""
        await super().shutdown()

    async def _close(self) -> None:
        self._stop.set()
        main = self._main
        if main is not None:
            try:
                await asyncio.wait_for(asyncio.shield(main), _SHUTDOWN_TIMEOUT)
            except TimeoutError:
                self.log.warning("enqueues still running after the shutdown timeout; cancelling")
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await main
            except Exception:
                self.log.exception("scheduler roles failed")
        try:
            await self._cleanup()
        finally:
            await self._close_connection()
            self.log.info("scheduler stopped")

    async def run(self) -> None:
        """Start, run until SIGTERM or SIGINT, then shut down (a second signal ends the
        process); raises RuntimeError when the scheduler's roles failed."""
        await self._run_until_signal(self.start)

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def ping(self) -> None:
        """Raise if Redis cannot be reached."""
        if self._conn is None:
            raise RuntimeError("the scheduler is not started")
        await self._conn.redis.ping()

    # -- roles ------------------------------------------------------------------------------

    async def _main_loop(self, task_status: TaskStatus[None]) -> None:
        """The scheduler's main task: its roles (:mod:`asyncq._scheduling.roles`: the
        heartbeat and one ticker per entry) and the ticks they fire, in one TaskGroup; it
        serves once the roles started (the first heartbeat was written in :meth:`_open`)."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            heartbeat = self._heartbeat_role
            spawn = functools.partial(tg.create_task, name=f"asyncq-scheduler-{heartbeat.name}")
            await start_task(spawn, functools.partial(supervise, heartbeat))
            for entry in self._entries.values():
                if entry.ticker is None:
                    self._start_ticker(entry)
            task_status.started()
            await self._stop.wait()
            heartbeat.request_stop()
            for entry in [*self._entries.values(), *self._retired.values()]:
                if entry.ticker is not None:
                    entry.ticker.request_stop()
                for fire in entry.fires:
                    # Ticks still waiting on another scheduler's claim are that one's
                    # to finish; ticks being enqueued here get to complete.
                    if fire not in self._enqueuing:
                        fire.cancel()
        self._tg = None

    def _start_ticker(self, entry: _Entry) -> None:
        assert self._tg is not None

        def moved(prev: datetime | None, following: datetime) -> None:
            entry.next = following
            if prev is not None:
                entry.prev = prev
                # Rewrite the entries record now rather than at the next heartbeat (up
                # to an interval away): until then `cron ls` and the web UI read the
                # record written before this tick, "Prev: never", "Next: <it> (now)".
                self._heartbeat_role.beat_now()

        entry.ticker = EntryTicker(
            self.log.bind(entry_id=entry.id, task_type=entry.task.type),
            entry.schedule,
            self.misfire_grace,
            fire=functools.partial(self._start_fire, entry),
            moved=moved,
        )
        # Supervised, not started with a handshake: a ticker has nothing to fail before
        # it serves, and register() (which starts one while the scheduler runs) is sync.
        self._tg.create_task(supervise(entry.ticker), name=f"asyncq-scheduler-entry-{entry.id}")

    def _start_fire(self, entry: _Entry, tick: datetime) -> None:
        assert self._tg is not None
        fire = self._tg.create_task(
            self._fire(entry, tick),
            name=f"asyncq-scheduler-tick-{entry.id}-{int(tick.timestamp())}",
        )
        entry.fires.add(fire)
        fire.add_done_callback(entry.fires.discard)

    async def _heartbeat(self) -> None:
        assert self._broker is not None
        listed = list(self._entries.values())
        if self.shared:
            listed = [e for e in listed if await self._hold_listing(e)]
            if not listed:  # another scheduler lists them all: no empty record
                await self._broker.clear_scheduler_entries(self.id)
                return
        entries = [e.proto() for e in listed]
        await self._broker.write_scheduler_entries(
            self.id, entries, 2 * self.heartbeat_interval.total_seconds()
        )

    async def _hold_listing(self, entry: _Entry) -> bool:
        """Take or renew the lease that makes this scheduler the one listing *entry*."""
        assert self._broker is not None
        ttl_ms = int(2 * self.heartbeat_interval.total_seconds() * 1000)
        key = keys.scheduler_lister_key(entry.identity)
        held, replaced = await self._broker.hold_listing(key, self.id, ttl_ms)
        if replaced is not None:
            self.log.warning(
                "the entry's listing lease held no scheduler's lease; replaced",
                key=key,
                found=replaced,
                entry_id=entry.id,
            )
        return held

    async def _release_listings(self) -> None:
        assert self._broker is not None
        for entry in [*self._entries.values(), *self._retired.values()]:
            await self._broker.release_listing(keys.scheduler_lister_key(entry.identity), self.id)

    async def _retire(self, entry: _Entry) -> None:
        if entry.fires:
            await asyncio.wait(set(entry.fires))
        if self.shared:
            return  # the history is every sharing scheduler's
        try:
            await self._clear_history(entry)
        except REDIS_ERRORS as exc:
            # Shutdown tries again; until then the history stays readable.
            self._log_redis_error("could not delete scheduler history", exc)

    async def _clear_history(self, entry: _Entry) -> None:
        assert self._broker is not None
        await self._broker.clear_scheduler_history(entry.id)
        self._retired.pop(entry.id, None)

    async def _cleanup(self) -> None:
        assert self._broker is not None
        try:
            await self._broker.clear_scheduler_entries(self.id)
            if self.shared:
                await self._release_listings()
        except REDIS_ERRORS as exc:
            self.log.error(
                "could not remove scheduler entries; they expire with their TTL",
                error=str(exc),
            )
        if self.shared:
            return  # the histories stay: other schedulers run the same entries
        for entry in [*self._entries.values(), *self._retired.values()]:
            try:
                await self._clear_history(entry)
            except REDIS_ERRORS as exc:
                self.log.error(
                    "could not delete scheduler history",
                    entry_id=entry.id,
                    error=str(exc),
                )

    async def _close_connection(self) -> None:
        client, conn = self._client, self._conn
        self._client = None
        self._conn = None
        if client is not None:
            await client.aclose()
        if conn is not None:
            await conn.aclose()

    def _log_redis_error(self, message: str, exc: BaseException, **kw: Any) -> None:
        if self._redis_errors.allow():
            self.log.error(
                message,
                error=f"{exc.__class__.__name__}: {exc}",
                suppressed=self._redis_errors.take_suppressed(),
                **kw,
            )

    # -- one tick ---------------------------------------------------------------------------

    async def _fire(self, entry: _Entry, tick: datetime) -> None:
        tick_unix = int(tick.timestamp())
        options = dict(entry.options)
        explicit_id = "task_id" in _merged_options(entry.task, entry.options)
        if not explicit_id:
            options["task_id"] = tick_task_id(entry.identity, tick_unix)
        if entry.jitter is not None:
            options["process_at"] = tick + tick_jitter(entry.identity, tick_unix, entry.jitter)
        log = self.log.bind(
            entry_id=entry.id,
            task_type=entry.task.type,
            queue=entry.queue,
            tick=tick.isoformat(),
            task_id=options.get("task_id"),
        )
        try:
            claimed = await self._claim(entry, tick_unix, log)
            if isinstance(claimed, BaseException):
                log.error("tick missed: no scheduler could enqueue it", error=str(claimed))
                await self._hook_error(entry.task, options, claimed, log)
                return
            if not claimed:
                return
            task = asyncio.current_task()
            assert task is not None
            self._enqueuing.add(task)
            try:
                await self._enqueue(entry, tick_unix, options, explicit_id, log)
            finally:
                self._enqueuing.discard(task)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("scheduler tick failed")

    async def _claim(self, entry: _Entry, tick_unix: int, log: Any) -> bool | BaseException:
        """True when this scheduler must enqueue the tick, False when another did it.

        Returns the last Redis error when the grace window ran out.
        """
        assert self._broker is not None
        broker = self._broker
        key = keys.scheduler_claim_key(entry.identity, tick_unix)
        deadline = tick_unix + self.misfire_grace.total_seconds()
        lease_ms = int(self.claim_lease.total_seconds() * 1000)
        backoff = Backoff(0.1, 2.0)
        last_error: BaseException | None = None
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                if last_error is not None:
                    return last_error
                return TimeoutError(f"claim {key} was still held after the misfire grace")
            try:
                outcome, holder, pttl = await broker.claim_tick(
                    key, self._claim_value(entry), lease_ms
                )
            except REDIS_ERRORS as exc:
                last_error = exc
                self._log_redis_error("could not claim a scheduler tick", exc, entry_id=entry.id)
                await asyncio.sleep(min(backoff.next_delay(), max(remaining, 0.0)))
                continue
            if outcome == "claimed":
                return True  # a new claim, or ours whose reply was lost
            if outcome == "replaced":
                log.warning(
                    "the tick's claim held no scheduler's claim; replaced", key=key, found=holder
                )
                return True
            if outcome == "done":
                if is_debug_enabled(log):
                    log.debug("tick enqueued by another scheduler", holder=holder)
                return False
            # Another scheduler is enqueueing it; if it dies, its lease runs out and
            # the next claim succeeds here.
            wait = (pttl if pttl > 0 else lease_ms) / 1000 + 0.01
            await asyncio.sleep(min(wait, remaining))

    async def _enqueue(
        self,
        entry: _Entry,
        tick_unix: int,
        options: dict[str, Any],
        explicit_id: bool,
        log: Any,
    ) -> None:
        assert self._client is not None and self._broker is not None
        deadline = tick_unix + self.misfire_grace.total_seconds()
        if self.pre_enqueue is not None:
            try:
                await _call_hook(self.pre_enqueue, entry.task, dict(options))
            except Exception as exc:
                log.exception("pre-enqueue hook failed; tick not enqueued")
                await self._mark_done(entry, tick_unix, "", log)
                await self._hook_post(None, exc, log)
                await self._hook_error(entry.task, options, exc, log)
                return
            if not await self._still_claimed(entry, tick_unix, log):
                return
        backoff = Backoff(0.1, 2.0)
        while True:
            try:
                info = await self._client.enqueue(entry.task, **options)
                break
            except TaskIdConflictError as exc:
                if explicit_id:
                    await self._enqueue_failed(entry, tick_unix, options, exc, log)
                    return
                # Our ID is derived from the tick: an earlier attempt (ours with a
                # lost reply, or a claimant that died) already wrote it.
                log.info("tick already enqueued by an earlier attempt")
                await self._mark_done(entry, tick_unix, str(options["task_id"]), log)
                return
            except REDIS_ERRORS as exc:
                remaining = deadline - time.time()
                if remaining <= 0:
                    await self._enqueue_failed(entry, tick_unix, options, exc, log)
                    return
                self._log_redis_error("enqueue failed; retrying", exc, entry_id=entry.id)
                await asyncio.sleep(min(backoff.next_delay(), remaining))
            except Exception as exc:
                await self._enqueue_failed(entry, tick_unix, options, exc, log)
                return
        await self._mark_done(entry, tick_unix, info.id, log)
        log.info("enqueued periodic task", task_id=info.id)
        await self._hook_post(info, None, log)
        event = SchedulerEnqueueEventProto(task_id=info.id, enqueue_time=datetime.now(UTC))
        try:
            await self._broker.record_scheduler_enqueue_event(entry.id, event)
        except REDIS_ERRORS as exc:
            log.error("could not record the scheduler enqueue event", error=str(exc))

    async def _enqueue_failed(
        self,
        entry: _Entry,
        tick_unix: int,
        options: dict[str, Any],
        exc: BaseException,
        log: Any,
    ) -> None:
        log.error("could not enqueue periodic task", error=f"{exc.__class__.__name__}: {exc}")
        # The outcome is final (duplicate, conflict, bad option, Redis gone for the
        # whole grace window): other schedulers must not try again.
        await self._mark_done(entry, tick_unix, "", log)
        await self._hook_post(None, exc, log)
        await self._hook_error(entry.task, options, exc, log)

    def _claim_value(self, entry: _Entry) -> str:
        # Per entry, so two identical entries of one scheduler do not share a claim.
        return f"{self.id}/{entry.id}"

    async def _still_claimed(self, entry: _Entry, tick_unix: int, log: Any) -> bool:
        """False when a slow pre-enqueue hook outlived the claim and another scheduler took over."""
        assert self._conn is not None
        try:
            holder = _text(
                await self._conn.redis.get(keys.scheduler_claim_key(entry.identity, tick_unix))
            )
        except REDIS_ERRORS:
            return True  # the enqueue retries; the derived task ID still guards it
        if holder is None or holder == self._claim_value(entry):
            return True
        log.warning(
            "the pre-enqueue hook outlasted the claim lease; another scheduler has the tick",
            holder=holder,
            claim_lease=str(self.claim_lease),
        )
        return False

    async def _mark_done(self, entry: _Entry, tick_unix: int, task_id: str, log: Any) -> None:
        assert self._conn is not None
        key = keys.scheduler_claim_key(entry.identity, tick_unix)
        ttl = self.misfire_grace + self.claim_lease + _DONE_MARGIN
        value = f"done:{self.id}:{task_id}"
        for attempt in range(3):
            try:
                await self._conn.redis.set(key, value, px=int(ttl.total_seconds() * 1000))
                return
            except REDIS_ERRORS as exc:
                if attempt == 2:
                    # The claim's lease runs out; whoever claims next finds the
                    # task by its derived ID and marks the tick done.
                    log.warning("could not mark the tick done", error=str(exc))
                    return
                await asyncio.sleep(0.1 * (attempt + 1))

    async def _hook_post(self, info: TaskInfo | None, exc: BaseException | None, log: Any) -> None:
        if self.post_enqueue is None:
            return
        try:
            await _call_hook(self.post_enqueue, info, exc)
        except Exception:
            log.exception("post-enqueue hook failed")

    async def _hook_error(
        self, task: Task, options: dict[str, Any], exc: BaseException, log: Any
    ) -> None:
        if self.error_handler is None:
            return
        try:
            await _call_hook(self.error_handler, task, dict(options), exc)
        except Exception:
            log.exception("scheduler error handler failed")

    def __repr__(self) -> str:
        return f"<Scheduler {self.id} {self._state} entries={len(self._entries)}>"


def _text(value: bytes | str | None) -> str | None:
    # Works whether or not a caller's client decodes responses.
    return value.decode() if isinstance(value, bytes) else value
