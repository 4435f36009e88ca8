"""Cross-language gateway: enqueue over HTTP, and HTTP-target tasks for workers.

Needs the ``gateway`` extra: ``pip install 'asyncq[gateway]'``.

- :func:`create_app`: a Starlette ASGI app with ``POST /api/queues/{queue}/tasks``
  (and a batch form), ``GET /api/queues/{queue}/tasks/{id}`` and an OpenAPI
  description, served by ``asyncq gateway`` or mounted in another ASGI app.
- :class:`HTTPTarget` / :func:`add_http_targets`: a handler that delivers tasks
  to an HTTP endpoint in any language, signed with HMAC-SHA256.
"""

from asyncq.gateway.app import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY_BYTES, create_app
from asyncq.gateway.signing import SignatureError, sign, verify_signature
from asyncq.gateway.target import (
    SKIP_RETRY_HEADER,
    HTTPTarget,
    HTTPTargetError,
    add_http_targets,
    parse_http_target,
)

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_BODY_BYTES",
    "SKIP_RETRY_HEADER",
    "HTTPTarget",
    "HTTPTargetError",
    "SignatureError",
    "add_http_targets",
    "create_app",
    "parse_http_target",
    "sign",
    "verify_signature",
]
