"""Typed-API usage checked by mypy (tests/app/test_typing.py).

Lines ending in ``# E: <code>`` must produce exactly that mypy error; every
other line must type-check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import assert_type

from asyncq import (
    App,
    Limits,
    PeriodicTaskManager,
    Run,
    Scheduler,
    SyncClient,
    Task,
    TaskHandle,
    typed_group,
)
from asyncq._scheduling.periodic import ConfigProvider
from asyncq.testing import run_until_empty


@dataclass
class Receipt:
    user_id: int
    lang: str


@dataclass
class State:
    greeting: str


@asynccontextmanager
async def lifespan() -> AsyncIterator[State]:
    yield State("hi")


app = App("redis://localhost:6379/0", lifespan=lifespan)
assert_type(app, App[State])
plain = App("redis://localhost:6379/0")
assert_type(plain, App[None])


@app.task(queue="email", max_retry=5, timeout=timedelta(seconds=30))
async def send_welcome(user_id: int, lang: str = "en") -> Receipt:
    assert_type(app.state, State)
    return Receipt(user_id, lang)


@app.task
def add(a: int, b: int) -> int:
    return a + b


assert_type(send_welcome.name, str)


def takes_text(text: str) -> None: ...


async def producer() -> None:
    handle = await send_welcome.enqueue(42, lang="de")
    assert_type(handle, TaskHandle[Receipt])
    receipt = await handle.result(timeout=10)
    assert_type(receipt, Receipt)
    later = await send_welcome.options(process_in=timedelta(minutes=5)).enqueue(7)
    assert_type(await later.result(), Receipt)
    assert_type(await (await add.enqueue(1, 2)).result(), int)
    assert_type(await add(1, 2), int)

    await send_welcome.enqueue("42")  # E: arg-type
    await send_welcome.enqueue(42, language="de")  # E: call-arg
    await send_welcome.enqueue()  # E: call-arg
    await add.enqueue(1, b="2")  # E: arg-type
    takes_text(await handle.result())  # E: arg-type
    await send_welcome.options(queue=3).enqueue(1)  # E: arg-type
    await send_welcome.options(retries=3).enqueue(1)  # E: call-arg


def sync_producer(client: SyncClient) -> None:
    handle = client.send(send_welcome, 1, "de")
    assert_type(handle.result(timeout=5), Receipt)
    client.send(send_welcome, "1")  # E: arg-type
    client.send(add, 1, 2, 3)  # E: call-arg


configured = App(
    "redis://localhost:6379/0", queues={"email": 3}, limits=Limits(rate_limits={"email": "5/s"})
)
App("redis://localhost:6379/0", queue_concurency={"email": 1})  # E: call-overload
App("redis://localhost:6379/0", concurrency="20")  # E: call-overload


async def worker() -> None:
    await configured.run_worker(burst=True, lease_duration=timedelta(seconds=60))
    await configured.run_worker(concurency=4)  # E: call-arg
    configured.server(limits=Limits(rate_limits={"email": 5}))  # E: dict-item


@app.task
async def shout(text: str, times: int = 1) -> str:
    return text * times


@app.task
async def total(values: list[int], discount: int = 0) -> int:
    return sum(values) - discount


async def pipes() -> None:
    pipe = add.s(1, 2).then(add, 5)
    assert_type(await (await pipe.enqueue()).result(), int)
    fan = typed_group(add.s(1, 2), add.s(3, 4)).then(total, discount=1)
    assert_type(await (await fan.enqueue()).result(), int)
    add.s(1, 2).then(shout)  # E: arg-type
    add.s(1, 2).then(add, "5")  # E: arg-type
    typed_group(add.s(1, 2)).then(add, 1)  # E: arg-type


async def options_are_typed(scheduler: Scheduler, provider: ConfigProvider) -> None:
    # The keyword options handed on to Client.enqueue / Scheduler / Server are typed too.
    scheduler.register("@every 1m", Task("tick"), queue="low", max_retry=2)
    scheduler.register("@every 1m", Task("tick"), max_retries=2)  # E: call-arg
    PeriodicTaskManager("redis://localhost:6379/0", provider, claim_lease=timedelta(seconds=9))
    PeriodicTaskManager("redis://localhost:6379/0", provider, location="UTC")  # E: arg-type
    await run_until_empty(configured, "redis://localhost:6379/0", concurrency=4)
    await run_until_empty(configured, "redis://localhost:6379/0", concurency=4)  # E: call-arg


@app.durable(queue="onboarding")
async def onboard(run: Run, user_id: int) -> str:
    sent = await run.step(add, user_id, 1)
    assert_type(sent, int)
    assert_type(await run.gather(*(run.step(add, i, 1) for i in range(3))), list[int])
    assert_type(await run.call(shout, "hi"), str)
    assert_type(run.now(), datetime)
    await run.step(add, "1", 2)  # E: arg-type
    await run.sleep(3)  # E: arg-type
    return str(sent)


async def durable_runs() -> None:
    handle = await onboard.start(42)
    assert_type(await handle.result(), str)
    await onboard.start("42")  # E: arg-type
    await app.signal("email:opened", key="42", payload={"at": "now"})
