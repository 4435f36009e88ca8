"""A server asyncq cannot run on is refused at first contact, naming the version it needs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from asyncq import Client, Inspector, Task, UnsupportedServerError
from asyncq._redis.scripts import check_server_version, parse_server_version


async def _read_command(reader: asyncio.StreamReader) -> list[bytes]:
    header = await reader.readline()
    if not header.startswith(b"*"):
        return header.split()
    args = []
    for _ in range(int(header[1:])):
        size = int((await reader.readline())[1:])
        args.append((await reader.readexactly(size + 2))[:-2])
    return args


@pytest.fixture
async def old_redis() -> AsyncIterator[str]:
    """A fake Redis 6.0.16: INFO says so, no script is loaded, everything else is OK."""
    info = b"# Server\r\nredis_version:6.0.16\r\nredis_mode:standalone\r\n"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while args := await _read_command(reader):
                name = args[0].upper()
                if name == b"INFO":
                    writer.write(b"$%d\r\n%s\r\n" % (len(info), info))
                elif name == b"EVALSHA":
                    writer.write(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")
                elif name == b"PING":
                    writer.write(b"+PONG\r\n")
                else:
                    writer.write(b"+OK\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"redis://127.0.0.1:{port}/0"


async def test_enqueue_on_redis_6_0_names_the_version_needed(old_redis: str) -> None:
    async with Client(old_redis) as client:
        with pytest.raises(UnsupportedServerError) as err:
            await client.enqueue(Task("t", b"x"))
    assert str(err.value) == (
        "Redis 6.0.16 is not supported: asyncq needs Redis 6.2 or later, or Valkey 7.2 or later"
    )


async def test_the_inspector_is_refused_too(old_redis: str) -> None:
    async with Inspector(old_redis) as inspector:
        with pytest.raises(UnsupportedServerError, match=r"^Redis 6\.0\.16 is not supported"):
            await inspector.delete_all("default", "archived")


async def test_the_test_server_passes(redis_url: str) -> None:
    r = Redis.from_url(redis_url)
    try:
        await check_server_version(r)  # raises on an unsupported server
        name, version = parse_server_version(await r.execute_command("INFO", "server"))
    finally:
        await r.aclose()
    assert name in ("Redis", "Valkey") and version[0].isdigit()


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (b"# Server\r\nredis_version:7.0.15\r\nos:Linux\r\n", ("Redis", "7.0.15")),
        ("# Server\r\nredis_version:7.2.4\r\nvalkey_version:9.1.2\r\n", ("Valkey", "9.1.2")),
        ({"redis_version": "6.2.14", "os": "Linux"}, ("Redis", "6.2.14")),
        ({"127.0.0.1:7000": {"redis_version": "7.4.1"}}, ("Redis", "7.4.1")),
    ],
)
def test_parse_server_version(reply: object, expected: tuple[str, str]) -> None:
    assert parse_server_version(reply) == expected
