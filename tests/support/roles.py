"""A processor on the in-memory broker (tests/support/fakebroker.py), as the worker-role
tests drive it: its dependencies, the syncer and notifier it hands writes to, and a handler
for each outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any

import structlog

from asyncq._worker.active import ActiveTasks
from asyncq._worker.config import ServerStats
from asyncq._worker.processor import Processor
from asyncq._worker.queueset import QueueSet
from asyncq._worker.roles import RoleDeps
from asyncq._worker.server import Server
from asyncq._worker.wakeup import QueueWakeup
from asyncq.errors import RateLimited, RevokeTask, SkipRetry
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task
from tests.support.fakebroker import FakeBroker

Q = "default"


def message(task_type: str = "t", **fields: Any) -> TaskMessage:
    base: dict[str, Any] = {"type": task_type, "queue": Q, "retry": 3, "timeout": 60}
    return TaskMessage(**{**base, **fields})


def role_deps(fake: FakeBroker, **options: Any) -> RoleDeps:
    config = Server("redis://127.0.0.1:9/0", **options).config  # validated; never connects
    return RoleDeps(
        broker=fake,  # type: ignore[arg-type]
        config=config,
        log=structlog.get_logger("test"),
        stats=ServerStats(),
        queues=QueueSet(config.queues),
    )


class Notifier:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.queues: list[str] = []

    def notify(self, queue: str, task_id: str) -> None:
        self.sent.append(task_id)
        self.queues.append(queue)

    async def aclose(self) -> None:
        return None


class Deferred:
    """Records the writes the processor hands to the syncer."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Callable[[], Awaitable[None]]]] = []

    def __call__(
        self, write: Callable[[], Awaitable[None]], *, deadline: float, what: str, msg: TaskMessage
    ) -> None:
        self.writes.append((what, write))


class Running:
    """A processor on a fake broker, its fetch loop running in the test's task group."""

    def __init__(
        self,
        fake: FakeBroker,
        handler: Callable[[Task], Coroutine[Any, Any, None]],
        *,
        server_id: str = "",
        **options: Any,
    ) -> None:
        self.fake = fake
        self.deps = role_deps(fake, **{"shutdown_timeout": timedelta(seconds=2), **options})
        self.active = ActiveTasks()
        self.deferred = Deferred()
        self.notifier = Notifier()
        self.wakeup = QueueWakeup()
        self.processor = Processor(
            self.deps,
            handler=handler,
            active=self.active,
            wakeup=self.wakeup,
            defer_write=self.deferred,
            on_burst_done=lambda: None,
            notifier=self.notifier,
            server_id=server_id,
        )
        self.loop_task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.loop_task = asyncio.create_task(self.processor.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.processor.drain(1.0)
        assert self.loop_task is not None
        await asyncio.wait_for(self.loop_task, 5)
        await self.processor.cleanup()


# -- a handler for each outcome (named as parametrized test ids show them) -----------------------


async def _returns(task: Task) -> None:
    return None


async def _fails(task: Task) -> None:
    raise ValueError("boom")


async def _skips(task: Task) -> None:
    raise SkipRetry("no")


async def _revokes(task: Task) -> None:
    raise RevokeTask("gone")


async def _rate_limited(task: Task) -> None:
    raise RateLimited(timedelta(seconds=30))


async def _exits(task: Task) -> None:
    raise SystemExit(3)


SERVER = "server-1"


class Armed(Running):
    """:class:`Running`, its subscriber listening on the server's delivery channel."""

    def __init__(self, fake: FakeBroker, handler: Any, **options: Any) -> None:
        super().__init__(fake, handler, server_id=SERVER, **options)
        self.wakeup.delivery = True

    async def __aenter__(self) -> Armed:
        await super().__aenter__()
        return self

    def deliver(self, **fields: Any) -> str:
        """Enqueue a task the way enqueue.lua delivers it, and pass its note on."""
        msg = message(**fields)
        note = self.fake.deliver(msg, SERVER)
        assert note is not None, "the processor was not armed"
        self.processor.receive_delivery(note)
        return msg.id
