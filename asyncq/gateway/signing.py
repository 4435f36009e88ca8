"""HMAC-SHA256 signatures of HTTP-target requests, and their verification.

A request to an HTTP target carries ``Asyncq-Timestamp: <unix seconds>`` and
``Asyncq-Signature: v1=<hex>``, where ``<hex>`` is the lowercase hex
HMAC-SHA256, keyed with the shared secret, of the ASCII timestamp, one ``.``,
and the raw request body: ``hmac(secret, f"{timestamp}." + body)``. A target
checks the signature in constant time and refuses timestamps too far from
its own clock (replays).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from datetime import timedelta

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "SignatureError",
    "sign",
    "verify_signature",
]

SIGNATURE_HEADER = "Asyncq-Signature"
TIMESTAMP_HEADER = "Asyncq-Timestamp"
_VERSION = "v1="


class SignatureError(ValueError):
    """A request's signature or timestamp is missing, malformed, stale or wrong."""


def _key(secret: str | bytes) -> bytes:
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("the signing secret cannot be empty")
    return key


def sign(secret: str | bytes, timestamp: int, body: bytes) -> str:
    """The ``Asyncq-Signature`` value for *body* sent at *timestamp* (unix seconds)."""
    digest = hmac.new(_key(secret), f"{timestamp}.".encode() + body, hashlib.sha256)
    return _VERSION + digest.hexdigest()


def verify_signature(
    secret: str | bytes,
    *,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
    tolerance: timedelta = timedelta(minutes=5),
    now: float | None = None,
) -> None:
    """Check a received request; raises SignatureError naming what is wrong.

    *timestamp* and *signature* are the raw header values (None when absent).
    """
    if not timestamp:
        raise SignatureError(f"missing {TIMESTAMP_HEADER} header")
    if not signature:
        raise SignatureError(f"missing {SIGNATURE_HEADER} header")
    try:
        ts = int(timestamp)
    except ValueError:
        raise SignatureError(f"{TIMESTAMP_HEADER} is not unix seconds: {timestamp!r}") from None
    current = time.time() if now is None else now
    if abs(current - ts) > tolerance.total_seconds():
        raise SignatureError(f"{TIMESTAMP_HEADER} is more than {tolerance} away from now")
    if not hmac.compare_digest(sign(secret, ts, body), signature.strip()):
        raise SignatureError(f"{SIGNATURE_HEADER} does not match the body")
