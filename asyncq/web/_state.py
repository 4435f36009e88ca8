"""The web app's shared state: configuration and the (lazily created) Inspector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.cluster import RedisCluster
from starlette.requests import Request

from asyncq import Inspector
from asyncq._redis.options import RedisTarget
from asyncq.web._live import LiveSamples

__all__ = ["WebState", "state"]


@dataclass(slots=True)
class WebState:
    """What every request handler needs."""

    target: RedisTarget | Inspector
    address: str
    read_only: bool
    poll_seconds: float
    page_size: int
    max_payload_length: int
    _inspector: Inspector | None = field(default=None)
    owns_inspector: bool = True
    live: LiveSamples = field(default_factory=LiveSamples)
    """The dashboard's live-chart samples (see :mod:`._live`)."""

    def inspector(self) -> Inspector:
        """The Inspector, created on first use (in the serving event loop)."""
        if self._inspector is None:
            if isinstance(self.target, Inspector):
                self._inspector = self.target
                self.owns_inspector = False
            else:
                self._inspector = Inspector(self.target)
        return self._inspector

    def is_cluster(self) -> bool:
        return isinstance(self.inspector().redis, RedisCluster)

    async def aclose(self) -> None:
        if self._inspector is not None and self.owns_inspector:
            await self._inspector.aclose()
        self._inspector = None

    def template_globals(self) -> dict[str, Any]:
        return {
            "read_only": self.read_only,
            "poll_seconds": self.poll_seconds,
            "address": self.address,
        }


def state(request: Request) -> WebState:
    """The WebState of the app serving *request* (works when mounted under a prefix)."""
    web: WebState = request.scope["asyncq.web"]
    return web
