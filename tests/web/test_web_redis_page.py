"""The web UI's Redis page names the server as it is: Valkey as ``Valkey x.y.z``, not its
``redis_version`` compatibility number (issue 41, item 12)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis as sync_redis

from asyncq.devserver import LocalServer, ServerBinary, embedded_binary
from asyncq.web import create_app

EMBEDDED = embedded_binary()


async def _server_card(url: str) -> str:
    app = create_app(url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):
        page = (await http.get("/redis")).text
    start = page.index("<h3>Server</h3><p>") + len("<h3>Server</h3><p>")
    return page[start : page.index("</p>", start)]


@pytest.fixture(scope="module")
def valkey() -> Iterator[str]:
    assert EMBEDDED is not None
    server = LocalServer(binary=ServerBinary(EMBEDDED, "asyncq[embedded]")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.mark.skipif(EMBEDDED is None, reason="the embedded extra (Valkey) is not installed")
async def test_valkey_shows_as_valkey(valkey: str) -> None:
    info = sync_redis.Redis.from_url(valkey).info("server")
    assert info["redis_version"] != info["valkey_version"]  # 7.2.4 for every Valkey
    assert await _server_card(valkey) == f"Valkey {info['valkey_version']}"


async def test_redis_shows_as_redis(redis_url: str) -> None:
    info = sync_redis.Redis.from_url(redis_url).info("server")
    assert await _server_card(redis_url) == f"Redis {info['redis_version']}"
