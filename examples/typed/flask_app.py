"""Flask + asyncq's blocking SyncClient (the same shape works in Django views).

Run::

    ASYNCQ_REDIS_URL=redis://localhost:6379/0 asyncq worker tasks:app -q reports
    ASYNCQ_REDIS_URL=redis://localhost:6379/0 flask --app flask_app run
"""

from __future__ import annotations

import atexit
import os
from typing import Any

import tasks
from flask import Flask, request

from asyncq import SyncClient, TaskArgumentError, TaskFailedError, TaskNotFoundError

client = SyncClient(os.environ.get("ASYNCQ_REDIS_URL", "redis://localhost:6379/0"))  # thread-safe
atexit.register(client.close)

app = Flask(__name__)


@app.post("/reports")
def create_report() -> tuple[dict[str, Any], int]:
    body = request.get_json(force=True)
    try:
        handle = client.send(tasks.build_report, body.get("user_id"), days=body.get("days", 7))
    except TaskArgumentError as exc:
        return {"error": str(exc)}, 400
    return {"task_id": handle.id}, 202


@app.get("/reports/<task_id>")
def get_report(task_id: str) -> tuple[dict[str, Any], int]:
    wait = min(float(request.args.get("wait", 10)), 60.0)
    try:
        report = client.handle_of(tasks.build_report, task_id).result(timeout=wait)
    except TimeoutError:
        return {"error": "the report is not ready yet"}, 504
    except TaskNotFoundError:
        return {"error": "no such report"}, 404
    except TaskFailedError as exc:
        return {"error": exc.last_error}, 422
    return report.model_dump(mode="json"), 200
