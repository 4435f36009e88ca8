"""Authentication, read-only mode and cross-site request protection (pure ASGI middleware)."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asyncq.web._errors import error_body

__all__ = ["CSRF_HEADER", "Auth", "SecurityMiddleware"]

CSRF_HEADER = "x-asyncq-request"
"""Header every mutating request must carry; browsers never add it to a cross-site request
without a CORS preflight, which this app never grants."""

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# No framing by other sites (a framed page could trick a click on an action button).
_SECURITY_HEADERS = (
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"content-security-policy", b"frame-ancestors 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)


@dataclass(frozen=True, slots=True)
class Auth:
    """Credentials the app requires: HTTP basic (*username*/*password*) and/or a bearer *token*.

    A browser can send the token through the basic-auth prompt as the password
    (any user name), so a token-protected UI still works in a browser.
    """

    username: str | None = None
    password: str | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if (self.username is None) != (self.password is None):
            raise ValueError("basic auth needs both a username and a password")
        if self.password is not None and not self.password:
            raise ValueError("the basic-auth password cannot be empty")
        if self.token is not None and not self.token:
            raise ValueError("the bearer token cannot be empty")

    @property
    def enabled(self) -> bool:
        return self.password is not None or self.token is not None

    def allows(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header value satisfies these credentials."""
        if not self.enabled:
            return True
        if not header:
            return False
        scheme, _, value = header.partition(" ")
        scheme = scheme.lower()
        value = value.strip()
        if scheme == "bearer" and self.token is not None:
            return hmac.compare_digest(value.encode(), self.token.encode())
        if scheme == "basic":
            try:
                decoded = base64.b64decode(value, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return False
            user, sep, password = decoded.partition(":")
            if not sep:
                return False
            if self.token is not None and hmac.compare_digest(
                password.encode(), self.token.encode()
            ):
                return True
            if self.username is not None and self.password is not None:
                user_ok = hmac.compare_digest(user.encode(), self.username.encode())
                pass_ok = hmac.compare_digest(password.encode(), self.password.encode())
                return user_ok and pass_ok
        return False


async def _reply(
    send: Send,
    status: int,
    message: str,
    headers: list[tuple[bytes, bytes]],
    code: str | None = None,
) -> None:
    payload = json.dumps(error_body(status, message, code=code)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _same_origin(origin: str, host: str | None) -> bool:
    if host is None:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


class SecurityMiddleware:
    """Refuses unauthenticated requests (401), mutations in read-only mode (405) and
    mutations without the CSRF header or from another origin (403)."""

    def __init__(
        self, app: ASGIApp, *, auth: Auth, read_only: bool, public: tuple[str, ...]
    ) -> None:
        self.app = app
        self.auth = auth
        self.read_only = read_only
        self.public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path: str = scope.get("path", "")
        root: str = scope.get("root_path", "")
        local = path[len(root) :] if root and path.startswith(root) else path
        if not local.startswith(self.public) and not self.auth.allows(headers.get("authorization")):
            await _reply(
                send,
                401,
                "authentication required",
                [(b"www-authenticate", b'Basic realm="asyncq", charset="UTF-8"')],
            )
            return
        method: str = scope["method"]
        if method not in _SAFE_METHODS:
            if self.read_only:
                await _reply(
                    send,
                    405,
                    "read-only mode: changes are disabled",
                    [(b"allow", b"GET, HEAD")],
                    code="read_only",
                )
                return
            if headers.get(CSRF_HEADER) != "1":
                await _reply(
                    send, 403, f"missing the {CSRF_HEADER} header (cross-site request refused)", []
                )
                return
            origin = headers.get("origin")
            if (
                origin is not None
                and origin != "null"
                and not _same_origin(origin, headers.get("host"))
            ):
                await _reply(send, 403, "cross-origin request refused", [])
                return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)
