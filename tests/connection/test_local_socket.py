"""The hot-path connection moves to the local server's unix socket, and only to that server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from asyncq import Task
from asyncq._producer.client import Client
from asyncq._redis.connection import Connection
from asyncq._redis.options import parse_redis_uri
from tests.support.redis_server import RedisServer


def _with_socket(path: Path) -> RedisServer:
    return RedisServer(extra_args=["--unixsocket", str(path), "--unixsocketperm", "700"])


@pytest.fixture(scope="module")
def local() -> Iterator[RedisServer]:
    server = RedisServer(extra_args=[])
    sock = server.dir / "redis.sock"
    server.extra_args = ["--unixsocket", str(sock), "--unixsocketperm", "700"]
    server.start()
    yield server
    server.cleanup()


async def _client_kinds(url: str) -> set[str]:
    """How the fast connection reached the server: 'unix' or 'tcp', from CLIENT LIST."""
    r = Redis.from_url(url)
    try:
        listing = (await r.execute_command("CLIENT", "LIST")).decode()
    finally:
        await r.aclose()
    kinds = set()
    for line in listing.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("name") == "" and fields.get("cmd") in ("evalsha", "info", "echo"):
            # Redis writes a unix socket's laddr as "/path:0", Valkey as "[/path:0]:0".
            kinds.add("unix" if "/" in fields.get("laddr", "") else "tcp")
    return kinds


async def test_loopback_url_uses_the_servers_unix_socket(local: RedisServer) -> None:
    conn = Connection(local.url + "?local_socket=true")
    try:
        assert conn.fast is not None
        assert await conn.fast.execute_command("ECHO", "hi") == b"hi"
        kinds = await _client_kinds(local.url)
        assert kinds == {"unix"}
        async with Client(conn) as client:
            info = await client.enqueue(Task("t", b"x"))
        assert await conn.redis.hget(f"asynq:{{default}}:t:{info.id}", "state") == b"pending"
    finally:
        await conn.aclose()


async def test_local_socket_is_opt_in(local: RedisServer) -> None:
    url = local.url
    assert parse_redis_uri(url).local_socket is False  # type: ignore[union-attr]
    assert parse_redis_uri(url + "?local_socket=false").local_socket is False  # type: ignore[union-attr]
    conn = Connection(url)
    try:
        assert conn.fast is not None
        await conn.fast.execute_command("ECHO", "hi")
        assert await _client_kinds(local.url) == {"tcp"}
    finally:
        await conn.aclose()


async def test_a_socket_of_another_server_is_not_used(tmp_path: Path) -> None:
    """The path CONFIG names may lead elsewhere (a container's path on the host): run_id decides."""
    claimed = tmp_path / "target.sock"
    target = _with_socket(claimed).start()
    other = _with_socket(tmp_path / "other.sock").start()
    try:
        # the target's socket path now leads to the other server
        os.replace(tmp_path / "other.sock", claimed)
        conn = Connection(target.url + "?local_socket=true")
        try:
            assert conn.fast is not None
            await conn.fast.execute_command("SET", "k", "v")
        finally:
            await conn.aclose()
        for server, value in ((target, b"v"), (other, None)):
            r = Redis.from_url(server.url)
            try:
                assert await r.get("k") == value
            finally:
                await r.aclose()
    finally:
        other.cleanup()
        target.cleanup()


def test_bad_local_socket_value_is_named() -> None:
    with pytest.raises(ValueError, match="local_socket"):
        parse_redis_uri("redis://localhost:6379/0?local_socket=maybe")
