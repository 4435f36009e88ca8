"""HTTP-target tasks: a handler that delivers a task to an HTTP endpoint in any language.

``mux.handle("php:", HTTPTarget("http://php-app.internal/tasks", secret=...))``
(or :func:`add_http_targets`, or ``asyncq worker --http-target 'php:*=http://...'``)
POSTs each task's payload, unchanged, to the URL with the task's metadata in
``Asyncq-*`` headers and an HMAC-SHA256 signature (see :mod:`asyncq.gateway.signing`).

- A 2xx answer completes the task; a non-empty body is stored as its result.
- A 4xx answer with ``Asyncq-Skip-Retry: true`` archives it at once (SkipRetry).
- Anything else (other statuses, redirects, connection errors, a timeout) is a
  failed attempt whose error names the status and starts the body.
- The task's timeout and deadline bound the request; when the task is
  cancelled (deadline, ``asyncq task cancel``, shutdown) the request is aborted.

Commands are deliberately not a task kind: a worker never runs a program
named by a task. Put the command behind an HTTP endpoint you control instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import httpx
import structlog

from asyncq import AsyncqError, ServeMux, SkipRetry, Task, __version__
from asyncq.gateway.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

__all__ = [
    "SKIP_RETRY_HEADER",
    "HTTPTarget",
    "HTTPTargetError",
    "add_http_targets",
    "parse_http_target",
]

SKIP_RETRY_HEADER = "Asyncq-Skip-Retry"
"""Response header a target sets (to ``true`` or ``1``) on a 4xx to skip the retries."""

_EXCERPT = 200
_DEADLINE_SLACK = 1.0  # seconds past the task's deadline before httpx gives up on its own
_TRUE = frozenset({"1", "true", "yes"})

log = structlog.get_logger("asyncq.gateway")


class HTTPTargetError(AsyncqError):
    """An HTTP target did not complete a task: bad status, unreachable, or too slow."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def _excerpt(body: bytes) -> str:
    text = " ".join(body[: _EXCERPT * 4].decode(errors="replace").split())
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


class HTTPTarget:
    """An async handler that delivers tasks to *url* (``http://`` or ``https://``).

    - *secret*: the shared HMAC secret (str or bytes, required, non-empty).
    - *timeout*: an upper bound on each request, on top of the task's own
      timeout and deadline (None: only those).
    - *max_result_bytes*: a longer 2xx body fails the attempt instead of
      being stored (asynq keeps results in Redis).
    - *content_type*: the ``Content-Type`` of the POSTed payload.
    - *client*: an ``httpx.AsyncClient`` to use (left open); by default the
      target makes its own on first use and :meth:`aclose` closes it.
    """

    __slots__ = (
        "_client",
        "_log_url",
        "_owns_client",
        "_secret",
        "content_type",
        "max_result_bytes",
        "timeout",
        "url",
    )

    def __init__(
        self,
        url: str,
        *,
        secret: str | bytes,
        timeout: timedelta | None = None,
        max_result_bytes: int = 1 << 20,
        content_type: str = "application/octet-stream",
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"HTTP target URL must be a str, got {type(url).__name__}")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"HTTP target URL must be http:// or https:// with a host: {url!r}")
        if not isinstance(secret, str | bytes) or not secret:
            raise ValueError("an HTTP target needs a non-empty signing secret")
        if timeout is not None and timeout <= timedelta(0):
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if max_result_bytes < 0:
            raise ValueError(f"max_result_bytes cannot be negative, got {max_result_bytes}")
        self.url = url
        self._log_url = _redact(url)
        self._secret = secret
        self.timeout = timeout
        self.max_result_bytes = max_result_bytes
        self.content_type = content_type
        self._client = client
        self._owns_client = client is None

    def __repr__(self) -> str:
        return f"<HTTPTarget url={self._log_url!r}>"

    async def aclose(self) -> None:
        """Close the HTTP client this target made (a client passed in stays open)."""
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        return self._client

    def _request_timeout(self, task: Task) -> float | None:
        bounds = []
        if self.timeout is not None:
            bounds.append(self.timeout.total_seconds())
        if task.deadline is not None:
            # The server cancels the handler at the task's deadline, which aborts the
            # request and records "context deadline exceeded"; this bound is a backstop.
            bounds.append(max(task.deadline.timestamp() - time.time(), 0.0) + _DEADLINE_SLACK)
        return min(bounds) if bounds else None

    def headers(self, task: Task, body: bytes, now: float) -> dict[str, str]:
        """The request headers for *task* (metadata and signature)."""
        timestamp = int(now)
        headers = {
            "Content-Type": self.content_type,
            "User-Agent": f"asyncq/{__version__}",
            "Asyncq-Task-Id": task.id or "",
            "Asyncq-Task-Type": task.type,
            "Asyncq-Task-Queue": task.queue or "",
            "Asyncq-Retry-Count": str(task.retry_count),
            "Asyncq-Max-Retry": str(task.max_retry if task.max_retry is not None else 0),
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: sign(self._secret, timestamp, body),
        }
        if task.deadline is not None:
            headers["Asyncq-Deadline"] = f"{task.deadline.timestamp():.3f}"
        if task.headers:
            headers["Asyncq-Task-Headers"] = json.dumps(task.headers, sort_keys=True)
        return headers

    async def __call__(self, task: Task) -> None:
        body = task.payload or b""
        headers = self.headers(task, body, time.time())
        bound = log.bind(task_id=task.id, task_type=task.type, queue=task.queue)
        timeout = self._request_timeout(task)
        started = time.monotonic()
        try:
            async with self._http().stream(
                "POST", self.url, content=body, headers=headers, timeout=timeout
            ) as response:
                data = await self._read(response)
        except httpx.TimeoutException as exc:
            within = f" within {timeout:.3f}s" if timeout is not None else ""
            raise HTTPTargetError(
                f"HTTP target {self._log_url} did not answer{within} ({type(exc).__name__})"
            ) from None
        except httpx.HTTPError as exc:
            raise HTTPTargetError(
                f"cannot reach HTTP target {self._log_url}: {type(exc).__name__}: {exc}"
            ) from None
        status = response.status_code
        bound.debug(
            "HTTP target answered",
            url=self._log_url,
            status=status,
            seconds=round(time.monotonic() - started, 3),
        )
        if 200 <= status < 300:
            if data and task.result_writer is not None:
                await task.result_writer.write(data)
            return
        reason = f"{status} {response.reason_phrase}".strip()
        excerpt = _excerpt(data)
        message = f"HTTP target {self._log_url} answered {reason}"
        if excerpt:
            message += f": {excerpt}"
        if 400 <= status < 500 and _is_true(response.headers.get(SKIP_RETRY_HEADER)):
            raise SkipRetry(message)
        raise HTTPTargetError(message, status=status)

    async def _read(self, response: httpx.Response) -> bytes:
        ok = 200 <= response.status_code < 300
        limit = self.max_result_bytes if ok else _EXCERPT * 4
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                if ok:
                    raise HTTPTargetError(
                        f"HTTP target {self._log_url} answered {response.status_code} with a "
                        f"body over max_result_bytes ({self.max_result_bytes} bytes)",
                        status=response.status_code,
                    )
                break  # only an excerpt of an error body is kept
        return b"".join(chunks)


def _is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def _mux_pattern(pattern: str) -> str:
    if not isinstance(pattern, str) or not pattern.strip():
        raise ValueError("an HTTP target's type pattern cannot be empty")
    if "*" in pattern[:-1]:
        raise ValueError(
            f"invalid HTTP target pattern {pattern!r}: '*' may only end it (a prefix match)"
        )
    mux_pattern = pattern.removesuffix("*")
    if not mux_pattern:
        raise ValueError("the HTTP target pattern '*' would match every task; name a prefix")
    return mux_pattern


def add_http_targets(
    mux: ServeMux,
    targets: Mapping[str, str],
    *,
    secret: str | bytes,
    timeout: timedelta | None = None,
    max_result_bytes: int = 1 << 20,
    content_type: str = "application/octet-stream",
    client: httpx.AsyncClient | None = None,
) -> list[HTTPTarget]:
    """Register an :class:`HTTPTarget` on *mux* for each ``{pattern: url}``.

    A pattern is a ServeMux pattern (exact type, else the longest matching
    prefix); a trailing ``*`` is allowed and spelled out: ``"php:*"`` serves
    every type starting with ``php:``. The keyword options are :class:`HTTPTarget`'s, the
    same for every target. Returns the targets, to ``aclose()``.
    """
    made = [
        (
            _mux_pattern(pattern),
            HTTPTarget(
                url,
                secret=secret,
                timeout=timeout,
                max_result_bytes=max_result_bytes,
                content_type=content_type,
                client=client,
            ),
        )
        for pattern, url in targets.items()
    ]
    for mux_pattern, target in made:
        mux.handle(mux_pattern, target)
    return [target for _, target in made]


def parse_http_target(text: str) -> tuple[str, str]:
    """``'php:*=http://php-app/tasks'`` -> ``("php:*", "http://php-app/tasks")``."""
    pattern, sep, url = text.partition("=")
    if not sep or not pattern.strip() or not url.strip():
        raise ValueError(
            f"invalid HTTP target {text!r}: expected PATTERN=URL, e.g. 'php:*=http://app/tasks'"
        )
    _mux_pattern(pattern.strip())
    return pattern.strip(), url.strip()
