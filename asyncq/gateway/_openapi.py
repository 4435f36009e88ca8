"""The gateway's OpenAPI 3.1 description, built from its pydantic models."""

from __future__ import annotations

import functools
from typing import Any

from pydantic.json_schema import models_json_schema

from asyncq import __version__
from asyncq.gateway._schema import (
    BatchRequest,
    BatchResponse,
    EnqueueRequest,
    ErrorBody,
    TaskInfoBody,
)

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _errors(*statuses: int) -> dict[str, Any]:
    what = {
        400: "Bad input; error.field names the field.",
        401: "Missing or wrong bearer token (or a non-local client without a token).",
        404: "No such queue or task.",
        409: "Duplicate (unique lock held) or task id conflict.",
        413: "Request body or batch too large.",
        415: "Body is not application/json.",
        503: "Redis is unreachable.",
    }
    return {str(s): _json("ErrorBody", what[s]) for s in statuses}


_QUEUE = {"name": "queue", "in": "path", "required": True, "schema": {"type": "string"}}
_TASK_ID = {"name": "task_id", "in": "path", "required": True, "schema": {"type": "string"}}


@functools.cache
def _base() -> dict[str, Any]:
    _, defs = models_json_schema(
        [
            (EnqueueRequest, "validation"),
            (BatchRequest, "validation"),
            (TaskInfoBody, "serialization"),
            (BatchResponse, "serialization"),
            (ErrorBody, "serialization"),
        ],
        ref_template=_REF,
    )
    schemas = defs.get("$defs", {})
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "asyncq gateway",
            "version": __version__,
            "description": (
                "Enqueue asyncq / asynq tasks over HTTP from any language and read their state."
            ),
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/queues/{queue}/tasks": {
                "post": {
                    "operationId": "enqueueTask",
                    "summary": "Enqueue one task",
                    "parameters": [_QUEUE],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("EnqueueRequest")}},
                    },
                    "responses": {
                        "201": _json("TaskInfoBody", "Enqueued."),
                        **_errors(400, 401, 409, 413, 415, 503),
                    },
                }
            },
            "/api/queues/{queue}/tasks/batch": {
                "post": {
                    "operationId": "enqueueTasks",
                    "summary": "Enqueue several tasks; each is checked and written on its own",
                    "parameters": [_QUEUE],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("BatchRequest")}},
                    },
                    "responses": {
                        "200": _json("BatchResponse", "One result per task, in order."),
                        **_errors(400, 401, 413, 415, 503),
                    },
                }
            },
            "/api/queues/{queue}/tasks/{task_id}": {
                "get": {
                    "operationId": "getTask",
                    "summary": "A task's state, error and result",
                    "parameters": [_QUEUE, _TASK_ID],
                    "responses": {
                        "200": _json("TaskInfoBody", "The task."),
                        **_errors(401, 404, 503),
                    },
                }
            },
            "/api/health": {
                "get": {
                    "operationId": "health",
                    "summary": "Redis reachability",
                    "responses": {
                        "200": {"description": "Redis answers."},
                        **_errors(401, 503),
                    },
                }
            },
            "/api/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": {"description": "OpenAPI 3.1 JSON."}},
                }
            },
        },
    }


def openapi_document(root_path: str = "") -> dict[str, Any]:
    """The description; *root_path* (the mount prefix) becomes its server URL."""
    doc = dict(_base())
    doc["servers"] = [{"url": root_path or "/"}]
    return doc
