"""The lifecycle shared by Server, Scheduler and PeriodicTaskManager (asyncq._service)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest
from anyio.abc import TaskStatus

from asyncq import PeriodicTaskManager, Scheduler, ServeMux, Server
from asyncq._service import Service


class Probe(Service):
    """A service that records its lifecycle calls; its main task waits to be stopped."""

    kind = "probe"

    def __init__(self, *, fail_open: bool = False, crash: bool = False) -> None:
        super().__init__()
        self.log = _Log()
        self.calls: list[str] = []
        self.fail_open = fail_open
        self.crash = crash
        self.stop = asyncio.Event()

    async def _open(self) -> None:
        self.calls.append("open")
        if self.fail_open:
            raise OSError("cannot connect")

    async def _main_loop(self, task_status: TaskStatus[None]) -> None:
        self.calls.append("main")
        task_status.started()
        if self.crash:
            raise ValueError("a role failed")
        await self.stop.wait()

    async def _close(self) -> None:
        self.calls.append("close")
        self.stop.set()
        if self._main is not None:
            await asyncio.gather(self._main, return_exceptions=True)

    async def _release(self) -> None:
        self.calls.append("release")

    async def start(self) -> None:
        await self._start_service()

    async def run(self) -> None:
        await self._run_until_signal(self.start)


class _Log:
    def info(self, *args: object, **kw: object) -> None:
        pass

    warning = error = info


async def test_start_then_shutdown_twice_closes_once() -> None:
    probe = Probe()
    assert probe.service_state == "new"
    await probe.start()
    assert probe.service_state == "running"
    await asyncio.sleep(0)
    await asyncio.gather(probe.shutdown(), probe.shutdown())
    await probe.shutdown()
    assert probe.service_state == "closed"
    assert probe.calls == ["open", "main", "close"]
    assert probe._main is not None and probe._main.done()


async def test_shutdown_before_start_releases_and_refuses_a_later_start() -> None:
    probe = Probe()
    await probe.shutdown()
    await probe.shutdown()
    assert probe.service_state == "closed" and probe.calls == ["release"]
    await probe.wait_closed()
    with pytest.raises(RuntimeError, match="the probe cannot start: it is closed"):
        await probe.start()


async def test_start_twice_is_refused() -> None:
    probe = Probe()
    await probe.start()
    with pytest.raises(RuntimeError, match="the probe cannot start: it is running"):
        await probe.start()
    await probe.shutdown()


async def test_a_failed_set_up_leaves_it_closed_and_released() -> None:
    probe = Probe(fail_open=True)
    with pytest.raises(OSError, match="cannot connect"):
        await probe.start()
    assert probe.service_state == "closed" and probe.calls == ["open", "release"]
    await probe.shutdown()  # nothing left to do
    assert probe.calls == ["open", "release"]


async def test_a_main_task_left_running_by_close_is_cancelled() -> None:
    class Stubborn(Probe):
        async def _close(self) -> None:
            self.calls.append("close")  # does not stop the main task

    probe = Stubborn()
    await probe.start()
    await probe.shutdown()
    assert probe._main is not None and probe._main.cancelled()


def _signal_soon(signum: int) -> Callable[[], None]:
    def send() -> None:
        os.kill(os.getpid(), signum)

    return send


async def test_run_until_a_signal_twice() -> None:
    for _ in range(2):  # a second service in the same process runs the same way
        probe = Probe()
        asyncio.get_running_loop().call_later(0.05, _signal_soon(signal.SIGTERM))
        await asyncio.wait_for(probe.run(), 10)
        assert probe.service_state == "closed"
        assert probe.calls == ["open", "main", "close"]


async def test_run_ends_when_the_main_task_fails_and_raises_it() -> None:
    probe = Probe(crash=True)
    with pytest.raises(RuntimeError, match="the probe's roles failed") as info:
        await asyncio.wait_for(probe.run(), 10)
    assert isinstance(info.value.__cause__, ValueError)
    assert probe.service_state == "closed"


async def test_run_with_a_failed_set_up_raises_it() -> None:
    probe = Probe(fail_open=True)
    with pytest.raises(OSError, match="cannot connect"):
        await asyncio.wait_for(probe.run(), 10)
    assert probe.service_state == "closed"


async def test_the_three_services_share_the_lifecycle(redis_url: str) -> None:
    assert issubclass(Server, Service) and issubclass(Scheduler, Service)
    assert issubclass(PeriodicTaskManager, Service)
    scheduler = Scheduler(redis_url)
    await scheduler.start()
    with pytest.raises(RuntimeError, match="the scheduler cannot start: it is running"):
        await scheduler.start()
    await asyncio.gather(scheduler.shutdown(), scheduler.shutdown())
    assert scheduler.service_state == "closed"

    manager = PeriodicTaskManager(redis_url, list)
    await manager.start()
    await manager.shutdown()
    assert manager.service_state == "closed" and manager.scheduler.service_state == "closed"

    server = Server(redis_url)
    await server.start(ServeMux())
    assert server.state == "active" and server.service_state == "running"
    server.stop()
    assert server.state == "stopped"
    await asyncio.gather(server.shutdown(), server.shutdown())
    assert server.state == "closed" and server.service_state == "closed"


async def test_scheduler_and_manager_run_until_a_signal(redis_url: str) -> None:
    for service in (Scheduler(redis_url), PeriodicTaskManager(redis_url, list)):
        asyncio.get_running_loop().call_later(0.3, _signal_soon(signal.SIGINT))
        await asyncio.wait_for(service.run(), 20)
        assert service.service_state == "closed"
