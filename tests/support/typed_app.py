"""Typed tasks used by the typed-API tests (also imported by a worker subprocess)."""

from __future__ import annotations

import asyncio
import enum
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from uuid import UUID

from pydantic import BaseModel
from typing_extensions import TypedDict

from asyncq import App, current_task


@dataclass
class Receipt:
    user_id: int
    lang: str
    task_id: str


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Profile(BaseModel):
    name: str
    tags: list[str] = []


@dataclass
class Point:
    x: float
    y: float


class Window(TypedDict):
    start: datetime
    end: datetime


class Kinds(BaseModel):
    when: datetime
    ident: UUID
    profile: Profile
    point: Point
    color: Color
    amount: Decimal
    window: Window
    tags: list[str]
    extra: dict[str, int] | None


@dataclass
class State:
    greeting: str
    events: list[str] = field(default_factory=list)


EVENTS: list[str] = []
"""Lifespan enter/exit, in order (per process)."""


@asynccontextmanager
async def lifespan() -> AsyncIterator[State]:
    state = State(greeting=os.environ.get("TYPED_APP_GREETING", "hello"))
    _event("enter")
    try:
        yield state
    finally:
        _event("exit")


def _event(name: str) -> None:
    EVENTS.append(name)
    path = os.environ.get("TYPED_APP_EVENTS_FILE")
    if path:  # a worker subprocess reports to its test
        with open(path, "a") as f:
            f.write(name + "\n")


app = App(os.environ.get("TYPED_APP_REDIS", "redis://127.0.0.1:1/0"), lifespan=lifespan)


@app.task(name="email:welcome", max_retry=2)
async def send_welcome(user_id: int, lang: str = "en") -> Receipt:
    return Receipt(user_id=user_id, lang=lang, task_id=current_task().id or "")


@app.task(name="typed:kinds")
async def echo_kinds(
    when: datetime,
    ident: UUID,
    profile: Profile,
    point: Point,
    color: Color,
    amount: Decimal,
    window: Window,
    tags: list[str],
    extra: dict[str, int] | None = None,
) -> Kinds:
    return Kinds(
        when=when, ident=ident, profile=profile, point=point, color=color, amount=amount,
        window=window, tags=tags, extra=extra,
    )  # fmt: skip


@app.task(name="typed:fail", max_retry=0)
async def fail(reason: str) -> None:
    raise ValueError(reason)


@app.task(name="typed:greet", max_retry=0)
async def greet(name: str) -> str:
    app.state.events.append(name)
    return f"{app.state.greeting}, {name}"


@app.task(name="typed:add", max_retry=0)
def add(a: int, b: int) -> int:
    return a + b


@app.task(name="typed:sleep", max_retry=0)
async def sleep(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@app.task(name="typed:pos", max_retry=0)
async def positional(a: int, /, b: int = 2) -> list[int]:
    return [a, b]


@app.task(name="typed:loop")
async def loop_kind() -> str:
    return type(asyncio.get_running_loop()).__module__


def create_app() -> App[State]:
    """A zero-argument factory, as ``asyncq worker tests.support.typed_app:create_app`` calls it."""
    return app


async def create_app_async() -> App[State]:
    return app
