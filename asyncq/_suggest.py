"""Near-miss suggestions for misspelt names ("did you mean 'max_retry'?")."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

__all__ = ["ENQUEUE_OPTION_ALIASES", "suggest"]

# Names other task queues (celery, arq, rq, dramatiq, asynq's Go options) use for
# asyncq's enqueue options; a close spelling alone would not find most of them.
ENQUEUE_OPTION_ALIASES: Mapping[str, str] = {
    "retries": "max_retry",
    "retry": "max_retry",
    "max_retries": "max_retry",
    "maxretry": "max_retry",
    "countdown": "process_in",
    "delay": "process_in",
    "defer_by": "process_in",
    "eta": "process_at",
    "defer_until": "process_at",
    "at": "process_at",
    "id": "task_id",
    "job_id": "task_id",
    "ttl": "retention",
    "keep_result": "retention",
    "expires": "deadline",
    "time_limit": "timeout",
    "unique_for": "unique",
    "uniqueness": "unique",
    "queue_name": "queue",
}


def suggest(
    name: str, choices: Iterable[str], aliases: Mapping[str, str] | None = None
) -> str | None:
    """The choice *name* most likely meant, or None when nothing is close."""
    known = sorted(set(choices))
    key = name.lower().replace("-", "_")
    if aliases is not None and key in aliases and aliases[key] in known:
        return aliases[key]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return close[0] if close else None
