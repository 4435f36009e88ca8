"""One classification of the errors a Redis call may raise.

* :data:`REDIS_ERRORS`: everything a broker call raises for a reason outside
  the caller's code (redis-py errors, script error replies, a task missing from
  the structure an operation expects, socket errors). Background work catches
  these, logs them at a bounded rate and tries again; they never crash a role.
* :data:`TRANSIENT_ERRORS` (:func:`is_transient`): the subset after which the
  same write may succeed when retried, because Redis was unreachable rather
  than refusing the command.
"""

from __future__ import annotations

import ssl

from redis import exceptions as redis_errors
from redis.exceptions import RedisError

from asyncq.errors import BrokerError, ReplicationTimeoutError, TaskNotFoundError

__all__ = [
    "REDIS_ERRORS",
    "TRANSIENT_ERRORS",
    "is_out_of_memory",
    "is_tls_verification_failure",
    "is_transient",
]

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,  # includes BusyLoadingError
    redis_errors.TimeoutError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.MasterDownError,
    redis_errors.ReadOnlyError,
    OSError,  # includes the builtin TimeoutError
)
"""Errors after which a broker write may succeed when retried (Redis unreachable)."""

REDIS_ERRORS: tuple[type[BaseException], ...] = (
    RedisError,
    BrokerError,
    TaskNotFoundError,
    ReplicationTimeoutError,  # min_replicas: written, replication unconfirmed
    OSError,
)
"""Errors raised by broker calls: logged at a bounded rate, never a role crash."""


def is_transient(exc: BaseException) -> bool:
    """True for connection-level failures (worth retrying later), False for error replies."""
    return isinstance(exc, TRANSIENT_ERRORS)


def is_out_of_memory(exc: BaseException) -> bool:
    """Redis refused a write at ``maxmemory`` (noeviction): ``OOM command not allowed ...``
    for a command or a flagged script, the same words without the prefix from inside a
    script."""
    if isinstance(exc, redis_errors.OutOfMemoryError):
        return True
    return isinstance(exc, redis_errors.ResponseError) and (
        "command not allowed when used memory > 'maxmemory'" in str(exc)
    )


def is_tls_verification_failure(exc: BaseException) -> bool:
    """The server's TLS certificate could not be verified (untrusted, expired, another
    host's name). Not transient: another attempt meets the same certificate."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        if "CERTIFICATE_VERIFY_FAILED" in str(current):
            return True  # redis-py's ConnectionError keeps only the text
        current = current.__cause__ or current.__context__
    return False
