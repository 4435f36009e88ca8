"""asyncq._redis: asynq's URI forms, client construction, ownership and live connections."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import AuthenticationError, ConnectionError, ResponseError

from asyncq._redis.connection import Connection, close_client, connect, pubsub_client
from asyncq._redis.options import (
    RedisClientOpts,
    RedisClusterOpts,
    RedisSentinelOpts,
    TLSConfig,
    parse_redis_uri,
)
from tests.support.cluster import TLSServer, redis_cli
from tests.support.redis_server import RedisServer

# -- URI parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("redis://localhost:6379", RedisClientOpts(host="localhost", port=6379)),
        ("redis://localhost", RedisClientOpts(host="localhost", port=6379)),
        ("redis://127.0.0.1:7000/3", RedisClientOpts(host="127.0.0.1", port=7000, db=3)),
        ("redis://localhost:6379/", RedisClientOpts(host="localhost", db=0)),
        ("redis://localhost:6379/2/extra", RedisClientOpts(host="localhost", db=2)),
        ("redis://:mypass@localhost:6379", RedisClientOpts(host="localhost", password="mypass")),
        (
            "redis://alice:s%3Acret%40x@redis.example.com:6380/1",
            RedisClientOpts(
                host="redis.example.com", port=6380, db=1, username="alice", password="s:cret@x"
            ),
        ),
        ("redis://alice@localhost", RedisClientOpts(host="localhost", username="alice")),
        ("redis://[::1]:6390/4", RedisClientOpts(host="::1", port=6390, db=4)),
        ("REDIS://Localhost:6379", RedisClientOpts(host="Localhost")),
        (
            "rediss://:pw@redis.example.com:6380/5",
            RedisClientOpts(
                host="redis.example.com", port=6380, db=5, password="pw", tls=TLSConfig()
            ),
        ),
        (
            "redis-socket:///var/run/redis.sock",
            RedisClientOpts(unix_socket_path="/var/run/redis.sock"),
        ),
        (
            "redis-socket://:pw@/var/run/redis.sock?db=7",
            RedisClientOpts(unix_socket_path="/var/run/redis.sock", db=7, password="pw"),
        ),
        (
            "redis-socket://bob:pw@/tmp/r.sock",
            RedisClientOpts(unix_socket_path="/tmp/r.sock", username="bob", password="pw"),
        ),
        (
            "redis-sentinel://localhost:26379,localhost:26380?master=mymaster",
            RedisSentinelOpts(
                master_name="mymaster",
                sentinel_addrs=(("localhost", 26379), ("localhost", 26380)),
            ),
        ),
        (
            # asynq: the URI password is the *sentinel* password
            "redis-sentinel://:spw@10.0.0.1:5000,10.0.0.2/2?master=m1",
            RedisSentinelOpts(
                master_name="m1",
                sentinel_addrs=(("10.0.0.1", 5000), ("10.0.0.2", 26379)),
                sentinel_password="spw",
                db=2,
            ),
        ),
        (
            # asyncq extension: the master's credentials as query parameters
            "redis-sentinel://su:spw@h:1?master=m&password=mpw&username=mu",
            RedisSentinelOpts(
                master_name="m",
                sentinel_addrs=(("h", 1),),
                sentinel_username="su",
                sentinel_password="spw",
                username="mu",
                password="mpw",
            ),
        ),
        (
            "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002",
            RedisClusterOpts(addrs=(("127.0.0.1", 7000), ("127.0.0.1", 7001), ("127.0.0.1", 7002))),
        ),
        (
            "redis-cluster://u:p@node1,node2:7001/",
            RedisClusterOpts(addrs=(("node1", 6379), ("node2", 7001)), username="u", password="p"),
        ),
    ],
)
def test_parse_redis_uri(uri: str, expected: object) -> None:
    assert parse_redis_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("http://localhost:6379", "unsupported uri scheme: 'http'"),
        ("unix:///tmp/redis.sock", "unsupported uri scheme: 'unix'"),
        ("localhost:6379", "expected <scheme>://"),
        ("localhost", "expected <scheme>://"),
        ("redis://localhost:6379/abc", "database number should be the first segment of the path"),
        ("redis://localhost:6379/-1", "database number must be >= 0"),
        ("redis://", "missing a host"),
        ("redis://:pw@:6379/0", "missing a host"),
        ("redis://localhost:notaport", "invalid port 'notaport'"),
        ("redis://localhost:70000", "port 70000 out of range"),
        ("redis://::1:6379", "write IPv6 addresses in brackets"),
        ("redis://localhost?db=2", "unknown query parameter 'db'"),
        ("redis://localhost/0#frag", "fragment"),
        ("redis-socket://", "path does not exist"),
        ("redis-socket://:pw@", "path does not exist"),
        ("redis-socket://tmp/redis.sock", "absolute path"),
        ("redis-socket:///tmp/r.sock?db=x", "query param `db` should be a number"),
        ("redis-socket:///tmp/r.sock?database=1", "unknown query parameter 'database'"),
        ("redis-sentinel://localhost:26379", "needs the master name"),
        ("redis-sentinel://localhost:26379?master=", "needs the master name"),
        ("redis-sentinel://?master=m", "missing a host"),
        ("redis-sentinel://h1,,h2?master=m", "missing a host"),
        ("redis-sentinel://h1/x?master=m", "database number should be the first segment"),
        ("redis-sentinel://h1?master=m&master=n", "given twice"),
        ("redis-sentinel://h1?master=m&sentinel_password=x", "unknown query parameter"),
        ("redis-cluster://", "missing a host"),
        ("redis-cluster://h1:7000/1", "cannot select a database"),
    ],
)
def test_parse_redis_uri_errors(uri: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_redis_uri(uri)
    assert message in str(info.value)


def test_error_messages_hide_the_password() -> None:
    with pytest.raises(ValueError) as info:
        parse_redis_uri("redis://alice:topsecret@localhost:bad")
    assert "topsecret" not in str(info.value)
    assert "alice:***@" in str(info.value)


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        parse_redis_uri(b"redis://localhost")  # type: ignore[arg-type]


@given(
    host=st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
    port=st.integers(1, 65535),
    db=st.integers(0, 10_000),
    password=st.text(min_size=1, max_size=20),
)
def test_parse_round_trips_quoted_credentials(host: str, port: int, db: int, password: str) -> None:
    from urllib.parse import quote

    opts = parse_redis_uri(f"redis://:{quote(password, safe='')}@{host}:{port}/{db}")
    assert opts == RedisClientOpts(host=host, port=port, db=db, password=password)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: RedisClientOpts(db=-1), "database number must be >= 0"),
        (lambda: RedisClientOpts(host=""), "host cannot be empty"),
        (lambda: RedisClientOpts(port=0), "out of range"),
        (lambda: RedisClientOpts(dial_timeout=0), "dial_timeout must be > 0"),
        (lambda: RedisClientOpts(read_timeout=-1), "read_timeout must be > 0"),
        (lambda: RedisClientOpts(unix_socket_path=""), "unix_socket_path cannot be empty"),
        (
            lambda: RedisClientOpts(unix_socket_path="/tmp/x", tls=TLSConfig()),
            "TLS is not supported over a unix socket",
        ),
        (
            lambda: RedisSentinelOpts(master_name=" ", sentinel_addrs=(("h", 1),)),
            "master name cannot be empty",
        ),
        (
            lambda: RedisSentinelOpts(master_name="m", sentinel_addrs=()),
            "at least one sentinel",
        ),
        (lambda: RedisClusterOpts(addrs=()), "at least one cluster node"),
    ],
)
def test_options_validate(factory: object, message: str) -> None:
    assert callable(factory)
    with pytest.raises(ValueError) as info:
        factory()
    assert message in str(info.value)


# -- client construction ------------------------------------------------------------------


async def test_plain_client_settings() -> None:
    client = connect("redis://alice:pw@example.invalid:6390/3")
    try:
        assert isinstance(client, Redis)
        kw = client.connection_pool.connection_kwargs
        assert (kw["host"], kw["port"], kw["db"]) == ("example.invalid", 6390, 3)
        assert (kw["username"], kw["password"]) == ("alice", "pw")
        assert kw["decode_responses"] is False
        assert kw["socket_connect_timeout"] == 5.0
        assert kw["socket_timeout"] == 3.0
        assert kw["health_check_interval"] == 30.0
        assert client.connection_pool.connection_class is not SSLConnection
    finally:
        await close_client(client)


async def test_tls_client_settings() -> None:
    client = connect("rediss://example.invalid")
    try:
        assert isinstance(client, Redis)
        assert client.connection_pool.connection_class is SSLConnection
        kw = client.connection_pool.connection_kwargs
        assert kw["ssl_cert_reqs"] == "required"
        assert kw["ssl_check_hostname"] is True
    finally:
        await close_client(client)


async def test_socket_client_settings() -> None:
    client = connect("redis-socket://:pw@/tmp/x.sock?db=2")
    try:
        assert isinstance(client, Redis)
        assert client.connection_pool.connection_class is UnixDomainSocketConnection
        kw = client.connection_pool.connection_kwargs
        assert (kw["path"], kw["db"], kw["password"]) == ("/tmp/x.sock", 2, "pw")
    finally:
        await close_client(client)


async def test_sentinel_client_settings() -> None:
    client = connect("redis-sentinel://su:spw@127.0.0.1:1,127.0.0.1:2/4?master=mm&password=mpw")
    try:
        assert isinstance(client, Redis)
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        assert pool.service_name == "mm"
        assert pool.connection_kwargs["db"] == 4
        assert pool.connection_kwargs["password"] == "mpw"
        sentinels = pool.sentinel_manager.sentinels
        assert len(sentinels) == 2
        skw = sentinels[0].connection_pool.connection_kwargs
        assert (skw["username"], skw["password"]) == ("su", "spw")
    finally:
        await close_client(client)


async def test_cluster_client_settings() -> None:
    client = connect("redis-cluster://u:p@127.0.0.1:7000,127.0.0.1:7001")
    try:
        assert isinstance(client, RedisCluster)
        assert [(n.host, n.port) for n in client.startup_nodes] == [
            ("127.0.0.1", 7000),
            ("127.0.0.1", 7001),
        ]
        assert client.connection_kwargs["password"] == "p"
        assert client.connection_kwargs["decode_responses"] is False
    finally:
        await close_client(client)


def test_connect_rejects_other_objects() -> None:
    with pytest.raises(TypeError, match="expected a redis URI"):
        connect(42)  # type: ignore[arg-type]


# -- ownership ------------------------------------------------------------------------------


async def test_connection_owns_what_it_creates(redis_url: str) -> None:
    async with Connection(redis_url) as conn:
        assert conn.owned
        assert await conn.redis.ping()
        pool = conn.redis.connection_pool  # type: ignore[union-attr]
    assert conn.closed
    # redis-py releases (disconnects) every pooled connection on close.
    assert all(not c.is_connected for c in pool._available_connections)
    await conn.aclose()  # idempotent


async def test_connection_shares_a_ready_client(redis: Redis) -> None:
    async with Connection(redis) as conn:
        assert not conn.owned
        assert conn.redis is redis
    assert conn.closed
    assert await redis.ping()  # still usable: not ours to close


async def test_connection_from_options(redis_url: str) -> None:
    opts = parse_redis_uri(redis_url)
    assert isinstance(opts, RedisClientOpts)
    async with Connection(opts) as conn:
        assert conn.owned
        assert await conn.redis.ping()


async def test_pubsub_client_shares_the_pool(redis: Redis) -> None:
    ps_client = await pubsub_client(redis)
    assert ps_client.connection_pool is redis.connection_pool
    pubsub = ps_client.pubsub()
    await pubsub.subscribe("asyncq-test-channel")
    await redis.publish("asyncq-test-channel", b"hello")
    message = None
    for _ in range(50):
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if message is not None:
            break
    assert message is not None
    assert message["data"] == b"hello"
    await pubsub.aclose()
    await ps_client.aclose()
    assert await redis.ping()  # closing the Pub/Sub view left the shared pool usable


async def test_connection_pubsub_is_closed_with_it(redis_url: str) -> None:
    conn = Connection(redis_url)
    first = await conn.pubsub()
    assert await conn.pubsub() is first
    await conn.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await conn.pubsub()


# -- live servers: password, ACL user, unix socket, TLS ---------------------------------------


@pytest.fixture(scope="module")
def secured_server() -> Iterator[RedisServer]:
    """requirepass for the default user, an ACL user alice, and a unix socket."""
    server = RedisServer()
    sock = server.dir / "redis.sock"
    server.extra_args = ["--unixsocket", str(sock), "--unixsocketperm", "700"]
    try:
        server.start()
        # Set after start: RedisServer's readiness probe is an unauthenticated PING.
        redis_cli(server.port, "ACL", "SETUSER", "alice", "on", ">alicepw", "~*", "&*", "+@all")
        redis_cli(server.port, "CONFIG", "SET", "requirepass", "defaultpw")
        yield server
    finally:
        server.cleanup()


@pytest.fixture
async def secured_db2(secured_server: RedisServer) -> AsyncIterator[Redis]:
    """An admin client on db 2 of the secured server, flushed first."""
    client = Redis(port=secured_server.port, password="defaultpw", db=2)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.mark.parametrize(
    "uri",
    [
        "redis://:defaultpw@127.0.0.1:{port}/2",
        "redis://alice:alicepw@127.0.0.1:{port}/2",
        "redis-socket://:defaultpw@{sock}?db=2",
        "redis-socket://alice:alicepw@{sock}?db=2",
    ],
)
async def test_live_credentials_and_db(
    uri: str, secured_server: RedisServer, secured_db2: Redis
) -> None:
    url = uri.format(port=secured_server.port, sock=secured_server.dir / "redis.sock")
    async with Connection(url) as conn:
        await conn.redis.set("asyncq-conn-test", b"\x00\xff")
        assert await conn.redis.get("asyncq-conn-test") == b"\x00\xff"  # raw bytes
        who = await conn.redis.acl_whoami()
    assert who == ("alice" if "alice" in url else "default")  # redis-py decodes WHOAMI
    assert await secured_db2.get("asyncq-conn-test") == b"\x00\xff"  # it went to db 2


async def test_live_wrong_password(secured_server: RedisServer) -> None:
    async with Connection(f"redis://alice:wrong@127.0.0.1:{secured_server.port}") as conn:
        with pytest.raises((AuthenticationError, ResponseError)):
            await conn.redis.ping()


async def test_live_refused_connection() -> None:
    from tests.support.redis_server import free_port

    async with Connection(f"redis://127.0.0.1:{free_port()}/0") as conn:
        with pytest.raises(ConnectionError):
            await conn.redis.ping()


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TLSServer]:
    server = TLSServer().start()
    try:
        yield server
    finally:
        server.cleanup()


async def test_live_tls_with_trusted_ca(tls_server: TLSServer) -> None:
    opts = RedisClientOpts(
        host="localhost", port=tls_server.tls_port, tls=TLSConfig(ca_certs=str(tls_server.cert))
    )
    async with Connection(opts) as conn:
        assert await conn.redis.ping()
        assert conn.redis.connection_pool.connection_class is SSLConnection  # type: ignore[union-attr]


async def test_live_rediss_verifies_the_certificate(tls_server: TLSServer) -> None:
    # rediss:// verifies against the system CAs, which do not know our self-signed cert.
    async with Connection(f"rediss://localhost:{tls_server.tls_port}") as conn:
        with pytest.raises(ConnectionError) as info:
            await conn.redis.ping()
    assert isinstance(info.value.__cause__ or info.value.__context__, ssl.SSLError) or (
        "certificate" in str(info.value).lower()
    )


async def test_live_tls_without_verification(tls_server: TLSServer) -> None:
    opts = RedisClientOpts(host="127.0.0.1", port=tls_server.tls_port, tls=TLSConfig(verify=False))
    async with Connection(opts) as conn:
        assert await conn.redis.ping()


async def test_callers_beyond_pool_size_wait_for_a_connection(redis_url: str) -> None:
    import asyncio

    opts = parse_redis_uri(redis_url)
    assert isinstance(opts, RedisClientOpts)
    client = RedisClientOpts(host=opts.host, port=opts.port, db=opts.db, pool_size=3).make_client()
    try:
        # 60 concurrent round trips on 3 connections: a non-blocking pool would
        # raise MaxConnectionsError on the fourth; here every caller waits its turn.
        results = await asyncio.gather(*(client.echo(f"m{i}") for i in range(60)))
        assert results == [f"m{i}".encode() for i in range(60)]
    finally:
        await client.aclose()
