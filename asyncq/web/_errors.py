"""The web API's error body, the gateway's shape: ``{"error": {"code", "message", "field"}}``.

One shape for every JSON error asyncq's HTTP servers answer, so a client handles
both the same way; the codes are the gateway's where the two mean the same thing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["error_body", "error_code"]

_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    500: "internal",
    501: "not_implemented",
    502: "redis_error",
    503: "redis_unavailable",
}


def error_code(status: int) -> str:
    """The code for an HTTP *status* when nothing more precise is known."""
    return _CODES.get(status, "internal" if status >= 500 else "invalid_request")


def error_body(
    status: int, message: str, *, code: str | None = None, field: str | None = None
) -> dict[str, Any]:
    """The JSON body of an error answered with *status*."""
    return {"error": {"code": code or error_code(status), "message": message, "field": field}}
