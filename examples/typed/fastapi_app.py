"""FastAPI + asyncq: one endpoint enqueues a typed task, another awaits its result.

Run::

    ASYNCQ_REDIS_URL=redis://localhost:6379/0 asyncq worker tasks:app -q reports
    ASYNCQ_REDIS_URL=redis://localhost:6379/0 uvicorn fastapi_app:api
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import tasks
from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel

from asyncq import TaskFailedError, TaskNotFoundError


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    async with tasks.app:  # opens the App's client in the server's event loop, closes it after
        yield


api = FastAPI(lifespan=lifespan)


class ReportRequest(BaseModel):
    user_id: int
    days: int = 7


class Accepted(BaseModel):
    task_id: str


@api.post("/reports", status_code=202)
async def create_report(body: ReportRequest) -> Accepted:
    handle = await tasks.build_report.enqueue(body.user_id, days=body.days)
    return Accepted(task_id=handle.id)


@api.get("/reports/{task_id}")
async def get_report(task_id: str, wait: float = Query(10.0, ge=0, le=60)) -> tasks.Report:
    handle = tasks.build_report.handle_of(task_id)
    try:
        return await handle.result(timeout=wait)
    except TimeoutError:
        raise HTTPException(status_code=504, detail="the report is not ready yet") from None
    except TaskNotFoundError:
        raise HTTPException(status_code=404, detail="no such report") from None
    except TaskFailedError as exc:
        raise HTTPException(status_code=422, detail=exc.last_error) from None
