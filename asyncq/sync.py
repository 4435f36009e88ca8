"""A blocking Client for Django, Flask and scripts: ``SyncClient``.

It runs an asyncio :class:`~asyncq.Client` on an event loop in one
background thread and hands every call to it, so it is safe to share between
threads (a web server's worker threads): calls from many threads are
multiplexed on the same connection pool. Options, return values and errors
are exactly those of the async Client; typed tasks are enqueued with
:meth:`SyncClient.send` and awaited with :meth:`SyncTaskHandle.result`::

    client = SyncClient("redis://localhost:6379/0")
    handle = client.send(send_welcome, 42, lang="de")       # typed like send_welcome
    receipt = handle.result(timeout=10)
    info = client.enqueue(Task("email:welcome", b"..."), queue="critical")
    client.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import types
from collections.abc import Coroutine, Iterable
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar

from typing_extensions import Unpack

from asyncq._producer.client import DEFAULT_QUEUE, Client
from asyncq._producer.completion import DEFAULT_POLL_INTERVAL
from asyncq._producer.failover import DEFAULT_RETRY, RetryPolicy
from asyncq._redis.options import RedisTarget
from asyncq.app import TaskCall, TaskHandle, TypedTask
from asyncq.task import EnqueueOptions, Task, TaskInfo

__all__ = ["SyncClient", "SyncTaskHandle"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class SyncTaskHandle(Generic[R]):
    """The blocking twin of :class:`~asyncq.TaskHandle`."""

    __slots__ = ("_client", "handle")

    def __init__(self, client: SyncClient, handle: TaskHandle[R]) -> None:
        self._client = client
        self.handle = handle

    @property
    def id(self) -> str:
        return self.handle.id

    @property
    def queue(self) -> str:
        return self.handle.queue

    @property
    def info(self) -> TaskInfo | None:
        return self.handle.info

    def result(
        self,
        timeout: timedelta | float | None = None,
        *,
        poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
    ) -> R:
        """Block until the task completes; as :meth:`TaskHandle.result`."""
        return self._client._call(self.handle.result(timeout, poll_interval=poll_interval))

    def __repr__(self) -> str:
        return f"<SyncTaskHandle id={self.id!r} queue={self.queue!r}>"


class SyncClient:
    """A thread-safe blocking client; see the module docstring.

    *redis* is what :class:`~asyncq.Client` takes except a ready
    ``redis.asyncio`` client (it would belong to another event loop);
    *retry* is the Client's enqueue retry policy.
    """

    def __init__(self, redis: RedisTarget, *, retry: RetryPolicy | None = DEFAULT_RETRY) -> None:
        if hasattr(redis, "execute_command"):
            raise TypeError(
                "SyncClient needs a URI or connection options: a ready redis.asyncio "
                "client belongs to another event loop"
            )
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="asyncq-sync-client", daemon=True
        )
        self._thread.start()
        try:
            self.client: Client = self._call(_make_client(redis, retry))
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("SyncClient methods cannot be called from its own event loop")
        with self._lock:
            if self._closed:
                coro.close()
                raise RuntimeError("the client is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise RuntimeError("the call was cancelled because the client closed") from None

    # -- the Client's API ---------------------------------------------------------------------

    def enqueue(self, task: Task, **options: Unpack[EnqueueOptions]) -> TaskInfo:
        """:meth:`Client.enqueue`, blocking."""
        return self._call(self.client.enqueue(task, **options))

    def enqueue_many(
        self,
        tasks: Iterable[Task | tuple[Task, EnqueueOptions]],
        **options: Unpack[EnqueueOptions],
    ) -> list[TaskInfo | Exception]:
        """:meth:`Client.enqueue_many`, blocking."""
        return self._call(self.client.enqueue_many(list(tasks), **options))

    def wait(
        self,
        task_id: str,
        *,
        queue: str = DEFAULT_QUEUE,
        timeout: timedelta | float | None = None,
        poll_interval: timedelta = DEFAULT_POLL_INTERVAL,
    ) -> TaskInfo:
        """:meth:`Client.wait`, blocking."""
        return self._call(
            self.client.wait(task_id, queue=queue, timeout=timeout, poll_interval=poll_interval)
        )

    def send(self, task: TaskCall[P, R], /, *args: P.args, **kwargs: P.kwargs) -> SyncTaskHandle[R]:
        """Enqueue a typed task (or ``task.options(...)``) with this client's connection."""
        call = task.options(client=self.client)
        return SyncTaskHandle(self, self._call(call.enqueue(*args, **kwargs)))

    def handle_of(
        self, task: TypedTask[P, R], task_id: str, *, queue: str | None = None
    ) -> SyncTaskHandle[R]:
        """A handle on an already enqueued typed task (``TypedTask.handle_of``), blocking."""
        return SyncTaskHandle(self, task.handle_of(task_id, queue=queue, client=self.client))

    def ping(self) -> None:
        self._call(self.client.ping())

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the connection and stop the loop thread; idempotent.

        Calls still running in other threads (a long ``result()``) raise
        RuntimeError instead of hanging.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        finally:
            self._stop_loop()

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        running = [t for t in asyncio.all_tasks() if t is not current]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self.client.aclose()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SyncClient closed={self._closed}>"


async def _make_client(redis: RedisTarget, retry: RetryPolicy | None) -> Client:
    return Client(redis, retry=retry)
