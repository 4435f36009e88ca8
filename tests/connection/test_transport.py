"""asyncq._redis.transport: the pipelined RESP connection under the Broker's hot path."""

from __future__ import annotations

import asyncio
import gc
import random
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis as sync_redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.exceptions import (
    AuthenticationError,
    ConnectionError,
    DataError,
    NoScriptError,
    ResponseError,
    TimeoutError,
)

from asyncq import _keys as keys
from asyncq._broker import BatchItem, Broker
from asyncq._producer.client import Client
from asyncq._producer.compose import new_task_id as _new_task_id
from asyncq._redis.connection import Connection
from asyncq._redis.options import (
    RedisClientOpts,
    RedisClusterOpts,
    RedisSentinelOpts,
    TLSConfig,
    parse_redis_uri,
)
from asyncq._redis.scripts import load_script
from asyncq._redis.transport import FastConnection
from asyncq.errors import TaskIdConflictError, TaskNotFoundError
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task
from tests.support import transitions
from tests.support.cluster import TLSServer, redis_cli
from tests.support.redis_server import RedisServer, free_port


def _opts(redis_url: str) -> RedisClientOpts:
    opts = parse_redis_uri(redis_url)
    assert isinstance(opts, RedisClientOpts)
    return opts


def _fast(redis_url: str, **changes: Any) -> FastConnection:
    opts = _opts(redis_url)
    kwargs: dict[str, Any] = {
        "host": opts.host,
        "port": opts.port,
        "db": opts.db,
        "username": opts.username,
        "password": opts.password,
    }
    kwargs.update(changes)
    return FastConnection(**kwargs)


@pytest.fixture
async def fast(redis_url: str, redis: Redis) -> AsyncIterator[FastConnection]:
    """A FastConnection on the same (flushed) database as the ``redis`` fixture."""
    conn = _fast(redis_url)
    yield conn
    await conn.aclose()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private redis-server the test may kill and restart."""
    srv = RedisServer().start()
    yield srv
    srv.cleanup()


# -- round trips ---------------------------------------------------------------------------

_values = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=100),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False),
)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=st.binary(min_size=1, max_size=60), value=_values)
async def test_set_get_is_byte_identical_to_redis_py(
    fast: FastConnection, redis: Redis, key: bytes, value: bytes | str | int | float
) -> None:
    assert await fast.execute_command("SET", key, value) == b"OK"
    stored = await redis.get(key)
    # redis-py's encoding of the same argument is the reference.
    assert stored == redis.get_encoder().encode(value)
    await redis.set(key, value)
    assert await fast.execute_command("GET", key) == stored


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(args=st.lists(st.binary(max_size=50), max_size=20))
async def test_eval_returns_arguments_as_nested_arrays(
    fast: FastConnection, args: list[bytes]
) -> None:
    script = "return {ARGV, #ARGV, {KEYS[1], {'x'}}}"
    reply = await fast.execute_command("EVAL", script, 1, b"k\x00", *args)
    assert reply == [args, len(args), [b"k\x00", [b"x"]]]


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("return 42", 42),
        ("return -7", -7),
        ("return 'bulk'", b"bulk"),
        ("return redis.status_reply('OK')", b"OK"),
        ("return nil", None),
        ("return false", None),
        ("return {}", []),
        ("return {1, {2, {3, 'deep'}}, 'x'}", [1, [2, [3, b"deep"]], b"x"]),
        ("return {1, nil, 3}", [1]),  # Lua stops an array at the first nil
        ("return 3.99", 3),  # Lua numbers become integers (truncated)
        ("return redis.call('GET', 'missing')", None),
    ],
)
async def test_eval_reply_types(fast: FastConnection, script: str, expected: Any) -> None:
    assert await fast.execute_command("EVAL", script, 0) == expected


async def test_error_inside_an_array_is_an_exception_value(fast: FastConnection) -> None:
    reply = await fast.execute_command("EVAL", "return {1, redis.error_reply('NOT FOUND')}", 0)
    assert reply[0] == 1
    assert type(reply[1]) is ResponseError
    assert str(reply[1]) == "NOT FOUND"


async def test_large_values_round_trip(fast: FastConnection) -> None:
    blobs = [random.randbytes(256 * 1024 + i) for i in range(24)]
    # Concurrent multi-megabyte writes pass the transport's write-buffer limits.
    assert await asyncio.gather(
        *(fast.execute_command("SET", f"big{i}", b) for i, b in enumerate(blobs))
    ) == [b"OK"] * len(blobs)
    got = await fast.pipeline([("GET", f"big{i}") for i in range(len(blobs))])
    assert got == blobs


async def test_argument_types(fast: FastConnection, redis: Redis) -> None:
    await fast.execute_command("RPUSH", "l", bytearray(b"ba"), memoryview(b"mv"), "é", 7, 1.5)
    assert await redis.lrange("l", 0, -1) == [b"ba", b"mv", "é".encode(), b"7", b"1.5"]
    for bad in (True, None, object()):
        with pytest.raises(DataError):
            await fast.execute_command("SET", "k", bad)


# -- error replies -------------------------------------------------------------------------


async def _error_from(call: Any) -> BaseException:
    try:
        await call
    except Exception as exc:  # the error under test
        return exc
    raise AssertionError("no error raised")


@pytest.mark.parametrize(
    "command",
    [
        ("EVALSHA", "0" * 40, 0),
        ("EVAL", "return redis.error_reply('NOT FOUND')", 0),
        ("EVAL", "return redis.error_reply('ERR ack_many: bad kinds')", 0),
        ("EVAL", "return redis.call('INCR', KEYS[1])", 1, "a-string"),
        ("EVAL", "syntax error here", 0),
        ("INCR", "a-string"),
        ("NOSUCHCOMMAND",),
        ("SET", "k"),
    ],
)
async def test_errors_map_exactly_as_redis_py(
    fast: FastConnection, redis: Redis, command: tuple[Any, ...]
) -> None:
    await redis.set("a-string", "x")
    mine = await _error_from(fast.execute_command(*command))
    theirs = await _error_from(redis.execute_command(*command))
    assert type(mine) is type(theirs)
    assert str(mine) == str(theirs)
    if command[0] == "EVALSHA":
        assert isinstance(mine, NoScriptError)


async def test_pipeline_returns_errors_in_place(fast: FastConnection) -> None:
    replies = await fast.pipeline(
        [("SET", "s", "v"), ("INCR", "s"), ("EVALSHA", "f" * 40, 0), ("GET", "s"), ("PING",)]
    )
    assert replies[0] == b"OK"
    assert isinstance(replies[1], ResponseError)
    assert isinstance(replies[2], NoScriptError)
    assert replies[3:] == [b"v", b"PONG"]
    assert await fast.pipeline([]) == []


async def test_script_reloads_after_flush(fast: FastConnection, redis: Redis) -> None:
    script = load_script("asyncq._broker", "enqueue")
    await redis.script_flush()
    assert await redis.script_exists(script.sha) == [False]
    msg = TaskMessage(id="t1", type="x", queue="q")
    qk = keys.task_key("q", "t1")
    args = (bytes(msg), "t1", 1, keys.wakeup_channel("q"), "q")
    assert await script(fast, (qk, keys.pending_key("q")), args) == 1
    assert await redis.script_exists(script.sha) == [True]


# -- many callers on one socket --------------------------------------------------------------


async def test_concurrent_callers_each_get_their_own_reply(
    fast: FastConnection, redis: Redis
) -> None:
    rng = random.Random(6)
    sha = await fast.script_load("return {KEYS[1], ARGV[1]}")
    pushed_by: set[int] = set()

    async def one(i: int) -> None:
        kind = rng.randrange(6)
        await asyncio.sleep(0) if rng.random() < 0.3 else None
        if kind == 0:
            assert await fast.execute_command("ECHO", f"e{i}") == f"e{i}".encode()
        elif kind == 1:
            assert await fast.evalsha(sha, 1, f"k{i}", i) == [f"k{i}".encode(), str(i).encode()]
        elif kind == 2:
            with pytest.raises(ResponseError, match=f"boom {i}"):
                await fast.execute_command("EVAL", f"return redis.error_reply('boom {i}')", 0)
        elif kind == 3:
            got = await fast.pipeline([("ECHO", i), ("INCR", f"c{i}"), ("INCR", f"c{i}")])
            assert got == [str(i).encode(), 1, 2]
        elif kind == 4:
            assert await fast.execute_command("SET", f"v{i}", i) == b"OK"
            assert await fast.execute_command("GET", f"v{i}") == str(i).encode()
        else:
            pushed_by.add(i)
            assert await fast.execute_command("RPUSH", "pushed", i) >= 1

    await asyncio.gather(*(one(i) for i in range(1000)))
    assert {int(x) for x in await redis.lrange("pushed", 0, -1)} == pushed_by


async def test_cancelled_caller_does_not_shift_replies(fast: FastConnection) -> None:
    with pytest.raises(asyncio.TimeoutError):
        async with asyncio.timeout(0.05):
            await fast.execute_command("BLPOP", "never", 0.3)
    # The late BLPOP reply (nil) arrives first and is dropped, not handed to us.
    assert await fast.execute_command("ECHO", "mine") == b"mine"


# -- failures --------------------------------------------------------------------------------


async def test_connection_killed_mid_flight(fast: FastConnection, redis: Redis) -> None:
    my_id = await fast.execute_command("CLIENT", "ID")
    blocked = [asyncio.ensure_future(fast.execute_command("BLPOP", f"b{i}", 0)) for i in range(3)]
    await _until(lambda: _blocked_clients(redis), 1)
    assert await redis.execute_command("CLIENT", "KILL", "ID", my_id) == 1
    for call in blocked:
        with pytest.raises(ConnectionError, match="may or may not have run"):
            await call
    # The next call reconnects.
    assert await fast.execute_command("ECHO", "again") == b"again"
    assert await fast.execute_command("CLIENT", "ID") != my_id


async def test_server_restart(server: RedisServer) -> None:
    fast = FastConnection(port=server.port, host="127.0.0.1", retries=2)
    admin = Redis(host="127.0.0.1", port=server.port)
    try:
        assert await fast.execute_command("SET", "k", "v") == b"OK"
        call = asyncio.ensure_future(fast.execute_command("BLPOP", "never", 0))
        # The BLPOP is in flight (blocked on the server) when the server goes away.
        await _until(lambda: _blocked_clients(admin), 1)
        await admin.aclose()
        await asyncio.to_thread(server.stop)
        with pytest.raises(ConnectionError):
            await call
        # Down: the connect is retried a bounded number of times, then fails.
        with pytest.raises(ConnectionError, match="Error connecting"):
            await fast.execute_command("PING")
        await asyncio.to_thread(server.start)
        assert await fast.execute_command("GET", "k") is None  # a new, empty server
    finally:
        await admin.aclose()
        await fast.aclose()


async def test_read_timeout_resets_the_connection(redis_url: str, redis: Redis) -> None:
    fast = _fast(redis_url, read_timeout=0.1)
    try:
        my_id = await fast.execute_command("CLIENT", "ID")
        first = asyncio.ensure_future(fast.execute_command("BLPOP", "never", 0))
        behind = asyncio.ensure_future(fast.execute_command("ECHO", "behind"))
        with pytest.raises(TimeoutError, match="connection was reset"):
            await first
        # Replies are FIFO: the call queued behind the late one cannot get its reply either.
        with pytest.raises(TimeoutError):
            await behind
        assert await fast.execute_command("ECHO", "later") == b"later"
        assert await fast.execute_command("CLIENT", "ID") != my_id
        # The old connection was closed: its BLPOP is not left blocking.
        await _until(lambda: _blocked_clients(redis), 0)
    finally:
        await fast.aclose()


async def test_read_timeout_under_client_pause(redis_url: str, redis: Redis) -> None:
    fast = _fast(redis_url, read_timeout=0.1)
    try:
        await fast.execute_command("PING")
        await redis.execute_command("CLIENT", "PAUSE", 500, "ALL")
        with pytest.raises(TimeoutError):
            await fast.execute_command("GET", "k")
        await redis.execute_command("CLIENT", "UNPAUSE")
        assert await fast.execute_command("ECHO", "ok") == b"ok"
    finally:
        await fast.aclose()


async def test_long_pipeline_with_replies_coming_does_not_time_out(redis_url: str) -> None:
    # Each reply comes 200 ms after the previous one, well inside the 1 s timeout
    # even when the machine is busy; 15 of them take 3 s, three times the timeout.
    probe = sync_redis.Redis.from_url(redis_url)
    try:
        valkey = "valkey_version" in probe.info("server")
    finally:
        probe.close()
    if valkey:
        # Valkey freezes TIME inside a script: the busy-wait below would spin until the
        # script time limit (5 s) instead of 200 ms. The transport is the same on any server.
        pytest.skip("the busy-wait script needs TIME to advance inside a script (Redis)")
    fast = _fast(redis_url, read_timeout=1.0)
    busy = (
        "local t0 = redis.call('TIME') local t "
        "repeat t = redis.call('TIME') "
        "until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) >= 200000 return 1"
    )
    try:
        # 15 x 200 ms of work, far beyond the timeout in total; the 64 KiB of padding
        # per command makes Redis read, run and answer them one at a time.
        pad = b"x" * 65536
        replies = await fast.pipeline([("EVAL", busy, 0, pad) for _ in range(15)])
        assert replies == [1] * 15
    finally:
        await fast.aclose()


async def test_refused_connection_raises() -> None:
    fast = FastConnection(host="127.0.0.1", port=free_port(), retries=1)
    with pytest.raises(ConnectionError, match="Error connecting"):
        await fast.execute_command("PING")
    await fast.aclose()


async def test_closed_connection_refuses_calls(fast: FastConnection, redis: Redis) -> None:
    call = asyncio.ensure_future(fast.execute_command("BLPOP", "never", 0))
    # The BLPOP is in flight (blocked on the server) when the connection is closed.
    await _until(lambda: _blocked_clients(redis), 1)
    await fast.aclose()
    assert fast.closed
    with pytest.raises(ConnectionError):
        await call
    with pytest.raises(ConnectionError, match="closed"):
        await fast.execute_command("PING")
    await fast.aclose()  # idempotent


def test_usable_from_successive_event_loops(redis_url: str) -> None:
    fast = _fast(redis_url)
    name = f"loops-{random.random()}"

    async def echo(text: str) -> Any:
        await fast.execute_command("CLIENT", "SETNAME", name)
        return await fast.execute_command("ECHO", text)

    async def named_clients(expected: int) -> None:
        async with Redis.from_url(redis_url) as admin:

            async def count() -> int:
                return sum(c["name"] == name for c in await admin.client_list())

            await _until(count, expected)

    with warnings.catch_warnings():
        # The dead loop's transport warns when collected; its socket was shut down already.
        warnings.simplefilter("ignore", ResourceWarning)
        assert asyncio.run(echo("one")) == b"one"
        assert asyncio.run(echo("two")) == b"two"  # reconnected on the new loop
        asyncio.run(named_clients(1))  # the first loop's connection is gone
        asyncio.run(fast.aclose())
        asyncio.run(named_clients(0))
        gc.collect()


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="dial_timeout"):
        FastConnection(dial_timeout=0)
    with pytest.raises(ValueError, match="read_timeout"):
        FastConnection(read_timeout=-1)
    with pytest.raises(ValueError, match="retries"):
        FastConnection(retries=-1)
    with pytest.raises(ValueError, match="unix socket"):
        FastConnection(unix_socket_path="/tmp/x", tls=TLSConfig())


# -- authentication, databases, unix sockets, TLS -------------------------------------------


@pytest.fixture(scope="module")
def secured_server() -> Iterator[RedisServer]:
    """requirepass for the default user, an ACL user alice, and a unix socket."""
    server = RedisServer()
    sock = server.dir / "redis.sock"
    server.extra_args = ["--unixsocket", str(sock), "--unixsocketperm", "700"]
    try:
        server.start()
        redis_cli(server.port, "ACL", "SETUSER", "alice", "on", ">alicepw", "~*", "&*", "+@all")
        redis_cli(server.port, "CONFIG", "SET", "requirepass", "defaultpw")
        yield server
    finally:
        server.cleanup()


@pytest.mark.parametrize(
    "uri",
    [
        "redis://:defaultpw@127.0.0.1:{port}/2",
        "redis://alice:alicepw@127.0.0.1:{port}/2",
        "redis-socket://:defaultpw@{sock}?db=2",
        "redis-socket://alice:alicepw@{sock}?db=2",
    ],
)
async def test_auth_and_select(uri: str, secured_server: RedisServer) -> None:
    url = uri.format(port=secured_server.port, sock=secured_server.dir / "redis.sock")
    fast = FastConnection.from_options(_opts(url))
    admin = Redis(port=secured_server.port, password="defaultpw", db=2)
    try:
        await admin.delete("fast-k")
        assert await fast.execute_command("SET", "fast-k", b"\x00\xff") == b"OK"
        assert await admin.get("fast-k") == b"\x00\xff"  # it went to db 2
        who = await fast.execute_command("ACL", "WHOAMI")
        assert who == (b"alice" if "alice" in url else b"default")
    finally:
        await fast.aclose()
        await admin.aclose()


@pytest.mark.parametrize("user", [None, "alice"])
async def test_wrong_password_is_not_retried(secured_server: RedisServer, user: str | None) -> None:
    fast = FastConnection(host="127.0.0.1", port=secured_server.port, username=user, password="no")
    with pytest.raises(AuthenticationError):
        await fast.execute_command("PING")
    await fast.aclose()


async def test_missing_password_fails_the_command(secured_server: RedisServer) -> None:
    fast = FastConnection(host="127.0.0.1", port=secured_server.port)
    with pytest.raises(AuthenticationError):
        await fast.execute_command("PING")
    await fast.aclose()


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TLSServer]:
    server = TLSServer().start()
    try:
        yield server
    finally:
        server.cleanup()


async def test_tls_with_trusted_ca(tls_server: TLSServer) -> None:
    tls = TLSConfig(ca_certs=str(tls_server.cert))
    fast = FastConnection(host="localhost", port=tls_server.tls_port, tls=tls)
    try:
        assert await fast.execute_command("ECHO", b"\x00secure") == b"\x00secure"
        assert await fast.pipeline([("PING",), ("ECHO", "x")]) == [b"PONG", b"x"]
    finally:
        await fast.aclose()


async def test_tls_verifies_the_certificate(tls_server: TLSServer) -> None:
    fast = FastConnection(host="localhost", port=tls_server.tls_port, tls=TLSConfig(), retries=0)
    with pytest.raises(ConnectionError, match=r"(?i)certificate"):
        await fast.execute_command("PING")
    await fast.aclose()


async def test_tls_without_verification(tls_server: TLSServer) -> None:
    tls = TLSConfig(verify=False)
    fast = FastConnection(host="127.0.0.1", port=tls_server.tls_port, tls=tls)
    try:
        assert await fast.execute_command("PING") == b"PONG"
    finally:
        await fast.aclose()


# -- Connection and Broker integration ---------------------------------------------------------


async def test_connection_has_fast_only_for_a_plain_server(redis_url: str) -> None:
    async with Connection(redis_url) as conn:
        assert conn.fast is not None
        assert await conn.fast.execute_command("PING") == b"PONG"
        fast = conn.fast
    assert fast.closed  # closed with the connection
    shared = Redis.from_url(redis_url)
    async with Connection(shared) as conn:
        assert conn.fast is None  # a ready client keeps its own settings
    await shared.aclose()
    sentinel = RedisSentinelOpts(master_name="m", sentinel_addrs=(("127.0.0.1", 1),))
    async with Connection(sentinel) as conn:
        assert conn.fast is None
    async with Connection(RedisClusterOpts(addrs=(("127.0.0.1", 1),))) as conn:
        assert conn.fast is None


async def test_client_enqueue_goes_through_fast(redis_url: str, redis: Redis) -> None:
    async with Client(redis_url) as client:
        assert client.broker.fast is not None
        info = await client.enqueue(Task("t", b"p"), queue="fq")
        assert await redis.lrange(keys.pending_key("fq"), 0, -1) == [info.id.encode()]
        assert await redis.smembers(keys.ALL_QUEUES) == {b"fq"}
        with pytest.raises(TaskIdConflictError):
            await client.enqueue(Task("t", b"p"), queue="fq", task_id=info.id)


def test_generated_task_ids_are_uuid4() -> None:
    ids = {_new_task_id() for _ in range(2000)}
    assert len(ids) == 2000
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # canonical lower-case form, as str(uuid.uuid4())
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


async def test_broker_hot_path_through_fast(
    fast: FastConnection, redis: Redis, redis_url: str
) -> None:
    broker = Broker(redis, fast=fast)
    await redis.script_flush()  # every script is reloaded on first use
    msgs = [TaskMessage(id=f"id{i}", type="t", queue=f"q{i % 3}", retry=3) for i in range(9)]
    for m in msgs[:3]:
        await broker.enqueue(m)
    results = await broker.enqueue_batch([BatchItem(m) for m in msgs[3:]])
    assert results == [None] * 6
    assert isinstance((await broker.enqueue_batch([BatchItem(msgs[0])]))[0], TaskIdConflictError)
    got = []
    for q in ("q0", "q1", "q2"):
        got += await transitions.dequeue_many(broker, [q], 10)
    assert sorted(d.message.id for d in got) == sorted(m.id for m in msgs)
    await broker.extend_lease("q0", ["id0", "id3"])
    assert await broker.write_result("q0", "id0", b"res") == 3
    assert await redis.hget(keys.task_key("q0", "id0"), "result") == b"res"
    await broker.publish_cancelation("id0")
    # Several queues in one ack pipeline.
    acks = await broker.ack_many([(d.message, d.message.queue == "q1") for d in got])
    assert acks == [None] * 9
    assert await redis.zcard(keys.completed_key("q1")) == 3
    assert await redis.llen(keys.active_key("q0")) == 0
    with pytest.raises(TaskNotFoundError):
        await broker.requeue(msgs[0])  # no longer active: asynq's "NOT FOUND"


# -- helpers -----------------------------------------------------------------------------------


async def _blocked_clients(redis: Redis) -> int:
    info = await redis.info("clients")
    return int(info["blocked_clients"])


async def _until(probe: Any, expected: int) -> None:
    """Wait (up to 10 s) until ``await probe()`` returns *expected*."""
    for _ in range(1000):
        if await probe() == expected:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"probe never returned {expected}")


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=st.lists(
        st.one_of(
            st.none(),
            st.binary(max_size=40),
            st.text(max_size=20),
            st.integers(-(2**63), 2**63 - 1),
        ),
        min_size=1,
        max_size=12,
    ),
    data=st.data(),
)
def test_a_packed_command_packs_as_the_whole_command(shape: list[Any], data: Any) -> None:
    from asyncq._redis.transport import PackedCommand, _pack_command

    values = [data.draw(st.binary(max_size=300)) for arg in shape if arg is None]
    given_values = iter(values)
    whole = tuple(next(given_values) if arg is None else arg for arg in shape)
    spread = tuple(part for value in values for part in (len(value), value))
    assert PackedCommand(shape).format % spread == _pack_command(whole)
    assert PackedCommand([b"100%", "%d%s", None]).format % (2, b"%b") == _pack_command(
        (b"100%", "%d%s", b"%b")
    )
