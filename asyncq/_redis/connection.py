"""One connection layer for client, server and inspector.

A :class:`Connection` is made from a URI, options (see
:mod:`asyncq._redis.options`) or a ready redis-py client; for a single server
it also opens the pipelined :class:`~asyncq._redis.transport.FastConnection`
the broker's hot path uses.
"""

from __future__ import annotations

import types

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import BlockingConnectionPool, ConnectionPool, SSLConnection
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from asyncq._redis.errors import is_tls_verification_failure
from asyncq._redis.options import (
    RedisClient,
    RedisClientOpts,
    RedisClusterOpts,
    RedisSentinelOpts,
    RedisTarget,
    parse_redis_uri,
)
from asyncq._redis.pubsub import FastPubSubClient
from asyncq._redis.transport import FastConnection

__all__ = [
    "Connection",
    "RedisClient",
    "check_tls",
    "close_client",
    "connect",
    "independent_target",
    "pubsub_client",
]


def connect(target: RedisTarget) -> RedisClient:
    """A redis-py client for *target*: a URI, parsed options or a ready client.

    A ready ``Redis``/``RedisCluster`` is returned as is (it stays the caller's
    to close); otherwise a new client is created, which the caller closes with
    :func:`close_client`. No I/O happens until the first command.
    """
    if isinstance(target, Redis | RedisCluster):
        return target
    if isinstance(target, str):
        target = parse_redis_uri(target)
    if isinstance(target, RedisClientOpts | RedisSentinelOpts | RedisClusterOpts):
        return target.make_client()
    raise TypeError(
        "expected a redis URI, RedisClientOpts/RedisSentinelOpts/RedisClusterOpts, "
        f"or a redis.asyncio Redis/RedisCluster client, got {target.__class__.__name__}"
    )


async def close_client(redis: RedisClient) -> None:
    """Close a client made by :func:`connect`, including its sentinel connections."""
    pool = None if isinstance(redis, RedisCluster) else redis.connection_pool
    await redis.aclose()
    if isinstance(pool, SentinelConnectionPool):
        manager: Sentinel = pool.sentinel_manager
        await manager.aclose()


async def pubsub_client(redis: RedisClient) -> Redis:
    """A plain client for Pub/Sub on *redis*; close it with ``aclose()`` when done.

    redis-py's asyncio ``RedisCluster`` has no Pub/Sub, so for a cluster this is
    a new connection to one node (PUBLISH reaches every node over the cluster
    bus, so any node will do). For a plain or Sentinel client it is a view on
    the same connection pool; closing it leaves *redis* usable.
    """
    if isinstance(redis, RedisCluster):
        await redis.initialize()
        node = redis.get_default_node() or redis.get_nodes()[0]
        kwargs = {k: v for k, v in node.connection_kwargs.items() if k != "redis_connect_func"}
        pool = ConnectionPool(connection_class=node.connection_class, **kwargs)
        # The pool is private to this client, so closing the client closes it.
        client: Redis = Redis.from_pool(pool)
        return client
    return Redis(connection_pool=redis.connection_pool)


def independent_target(target: RedisTarget) -> RedisTarget | None:
    """A target for a second, independent connection to what *target* reaches.

    A URI or options are reused as they are; a ready plain ``Redis`` client is
    copied from its pool's settings (a new pool, usable on another event loop).
    None for a ready Cluster or Sentinel client, whose settings cannot be copied.
    """
    if isinstance(target, str | RedisClientOpts | RedisSentinelOpts | RedisClusterOpts):
        return target
    if isinstance(target, Redis):
        pool = target.connection_pool
        if type(pool) in (ConnectionPool, BlockingConnectionPool):
            copy = ConnectionPool(connection_class=pool.connection_class, **pool.connection_kwargs)
            client: Redis = Redis.from_pool(copy)  # closing the client closes its pool
            return client
    return None


class Connection:
    """The Redis connection of a Client, Server or Inspector.

    Built from a URI or options, it owns the client and closes it in
    :meth:`aclose`; built from a ready redis-py client, it shares it and leaves
    it open.

    For a single server (TCP, unix socket or TLS) built from a URI or options,
    :attr:`fast` is one pipelined socket to the same server and database for
    the broker's hot path (see :mod:`asyncq._redis.transport`): same
    credentials, TLS, dial and read timeouts, but only the connect is retried,
    never a command already written. For Sentinel, Cluster and ready clients
    it is None and everything goes through redis-py.
    """

    __slots__ = ("_closed", "_pubsub", "fast", "owned", "redis")

    def __init__(self, target: RedisTarget) -> None:
        if isinstance(target, str):
            target = parse_redis_uri(target)
        self.redis: RedisClient = connect(target)
        self.owned: bool = self.redis is not target
        self.fast: FastConnection | None = None
        if isinstance(target, RedisClientOpts):
            self.fast = FastConnection.from_options(target)
        self._pubsub: Redis | FastPubSubClient | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` ran."""
        return self._closed

    async def pubsub(self) -> Redis | FastPubSubClient:
        """A source of Pub/Sub connections, created once and closed with us.

        Its ``pubsub()`` gives a subscription: on a plain server a
        :class:`~asyncq._redis.pubsub.FastPubSub` dialled like :attr:`fast`,
        else redis-py's (see :func:`pubsub_client`).
        """
        if self._closed:
            raise RuntimeError("the connection is closed")
        if self._pubsub is None:
            if self.fast is not None:
                self._pubsub = FastPubSubClient(self.fast)
            else:
                self._pubsub = await pubsub_client(self.redis)
        return self._pubsub

    async def aclose(self) -> None:
        """Close the client if we own it (idempotent); a shared client stays open."""
        if self._closed:
            return
        self._closed = True
        if self._pubsub is not None:
            await self._pubsub.aclose()
            self._pubsub = None
        if self.fast is not None:
            await self.fast.aclose()
        if self.owned:
            await close_client(self.redis)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        kind = "owned" if self.owned else "shared"
        return f"<Connection {kind} {self.redis!r}>"


async def check_tls(redis: object) -> None:
    """On a TLS connection, PING once and raise at once when the server's certificate
    cannot be verified: that never heals, so a worker must not start and retry forever.
    Any other failure (Redis down) is left to the usual reconnecting."""
    pool = getattr(redis, "connection_pool", None)
    connection_class = getattr(pool, "connection_class", None)
    if not (isinstance(connection_class, type) and issubclass(connection_class, SSLConnection)):
        return
    try:
        await redis.ping()  # type: ignore[attr-defined]
    except Exception as exc:
        if is_tls_verification_failure(exc):
            raise
