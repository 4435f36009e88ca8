"""Typed tasks shared by the FastAPI and Flask examples (and run by ``asyncq worker tasks:app``).

The worker::

    ASYNCQ_REDIS_URL=redis://localhost:6379/0 asyncq worker tasks:app -q reports
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from pydantic import BaseModel

from asyncq import App, SkipRetry


class Report(BaseModel):
    user_id: int
    days: int
    total: float
    generated_at: datetime
    generated_by: str


@dataclass
class Resources:
    """What the worker opens once per process (a DB pool, an HTTP client...)."""

    rates: dict[date, float]
    worker_name: str


@asynccontextmanager
async def lifespan() -> AsyncIterator[Resources]:
    today = datetime.now(UTC).date()
    rates = {today - timedelta(days=i): 1.0 + i / 10 for i in range(31)}
    yield Resources(rates=rates, worker_name=f"worker-{os.getpid()}")


app = App(os.environ.get("ASYNCQ_REDIS_URL", "redis://localhost:6379/0"), lifespan=lifespan)


@app.task(name="reports:build", queue="reports", max_retry=3, timeout=timedelta(minutes=1))
async def build_report(user_id: int, days: int = 7) -> Report:
    if not 1 <= days <= 30:  # retrying cannot fix this: archive the task at once
        raise SkipRetry(f"days must be between 1 and 30, got {days}")
    rates = app.state.rates
    today = datetime.now(UTC).date()
    total = sum(rates[today - timedelta(days=i)] for i in range(days)) * user_id
    return Report(
        user_id=user_id,
        days=days,
        total=round(total, 2),
        generated_at=datetime.now(UTC),
        generated_by=app.state.worker_name,
    )
