"""Connection options: asynq's Redis URIs and the option classes they parse into.

asyncq reads asynq's connection URIs (``ParseRedisURI``) plus one extension,
and turns them into redis-py asyncio clients:

======================================================  =====================================
URI                                                     client
======================================================  =====================================
``redis://[user:password@]host[:port][/db]``            plain TCP
``rediss://[user:password@]host[:port][/db]``           TLS (server name = host)
``redis-socket://[:password@]/path[?db=N]``             unix socket
``redis-sentinel://[:password@]h1:p1,h2:p2[/db]``       Sentinel master discovery
``    [?master=name][&password=p][&username=u]``
``redis-cluster://[user:password@]h1:p1,h2:p2``         Redis Cluster (asyncq extension)
======================================================  =====================================

Differences from asynq, on purpose:

* a username in ``redis://`` / ``rediss://`` is used for Redis ACLs (asynq drops it);
* in ``redis-sentinel://`` the URI's user info authenticates to the *sentinels*
  (as in asynq); the master's credentials come from the asyncq-only ``?password=``
  and ``?username=`` query parameters;
* ``redis-cluster://`` is asyncq's own scheme (asynq has no cluster URI);
* unknown query parameters, a missing host, a negative database number or a
  sentinel URI without ``?master=`` are errors instead of being ignored;
  a bare trailing ``/`` means database 0 (asynq rejects it);
* ``redis://`` to a loopback host (``localhost``, ``127.0.0.1``, ``::1``) moves
  asyncq's pipelined hot-path connection to the server's unix socket, with
  ``?local_socket=true`` (opt-in), when it has one this process can open and it
  leads to the same server;
* every kind, Sentinel and Cluster included, keeps at most ``pool_size``
  connections (per node for a cluster), and callers beyond it wait up to
  ``pool_timeout`` for a free one instead of failing at once.

Responses are always raw bytes (``decode_responses=False``): task messages
are binary protobufs. Timeouts and retries follow asynq's go-redis defaults:
5 s to connect, 3 s per read/write, up to 3 retries after a connection error
with 8-512 ms backoff. A read timeout is not retried (the command may have
run already; go-redis does the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import parse_qsl, unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = [
    "RedisClient",
    "RedisClientOpts",
    "RedisClusterOpts",
    "RedisConnOpts",
    "RedisSentinelOpts",
    "RedisTarget",
    "TLSConfig",
    "parse_redis_uri",
    "redact_uri",
]

RedisClient: TypeAlias = "Redis | RedisCluster"
"""The redis-py asyncio clients asyncq works with."""

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """TLS settings; the server certificate is checked against the host name."""

    ca_certs: str | None = None
    """PEM file of trusted CAs (default: the system store)."""
    certfile: str | None = None
    """Client certificate for mutual TLS."""
    keyfile: str | None = None
    """Private key of *certfile*."""
    verify: bool = True
    """Verify the server certificate and host name; turn off only for testing."""

    def _kwargs(self) -> dict[str, Any]:
        return {
            "ssl": True,
            "ssl_ca_certs": self.ca_certs,
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.keyfile,
            "ssl_cert_reqs": "required" if self.verify else "none",
            "ssl_check_hostname": self.verify,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class _CommonOpts:
    username: str | None = None
    """ACL user name (Redis >= 6); None = the default user."""
    password: str | None = None
    """Password of *username* (or ``requirepass``)."""
    tls: TLSConfig | None = None
    """TLS settings, or None for a plain connection."""
    dial_timeout: float = 5.0
    """Seconds to establish a connection (asynq's DialTimeout)."""
    read_timeout: float | None = 3.0
    """Seconds to wait for a reply (asynq's ReadTimeout); None = wait forever."""
    health_check_interval: float = 30.0
    """PING a pooled connection idle for longer than this before reusing it."""
    retries: int = 3
    """Times a command is retried after a connection error (go-redis's MaxRetries)."""
    pool_size: int = 50
    """Connections kept per client; callers beyond it wait for a free one."""
    pool_timeout: float = 20.0
    """Seconds a caller waits for a free pooled connection before ConnectionError."""

    def _check_common(self) -> None:
        if not self.dial_timeout > 0:
            raise ValueError(f"dial_timeout must be > 0 seconds, got {self.dial_timeout}")
        if self.read_timeout is not None and not self.read_timeout > 0:
            raise ValueError(f"read_timeout must be > 0 seconds or None, got {self.read_timeout}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int):
            raise TypeError(f"retries must be an int, got {self.retries.__class__.__name__}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.health_check_interval < 0:
            raise ValueError(
                f"health_check_interval must be >= 0, got {self.health_check_interval}"
            )
        if isinstance(self.pool_size, bool) or not isinstance(self.pool_size, int):
            raise TypeError(f"pool_size must be an int, got {self.pool_size.__class__.__name__}")
        if self.pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {self.pool_size}")
        if not self.pool_timeout > 0:
            raise ValueError(f"pool_timeout must be > 0 seconds, got {self.pool_timeout}")

    def _retry(self) -> Retry:
        # go-redis's backoff (8 ms doubling up to 512 ms) rather than redis-py's 1-10 s,
        # and only on connection errors: after a read timeout the command may have
        # run, and running a broker script twice is not harmless.
        return Retry(
            ExponentialWithJitterBackoff(cap=0.512, base=0.008),
            self.retries,
            supported_errors=(RedisConnectionError,),
        )

    def _socket_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "socket_connect_timeout": self.dial_timeout,
            "socket_timeout": self.read_timeout,
            "health_check_interval": self.health_check_interval,
            "decode_responses": False,
            "retry": self._retry(),
        }
        if self.tls is not None:
            kwargs.update(self.tls._kwargs())
        return kwargs


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisClientOpts(_CommonOpts):
    """A single Redis server over TCP or a unix socket (asynq's RedisClientOpt)."""

    host: str = "localhost"
    port: int = DEFAULT_PORT
    unix_socket_path: str | None = None
    """Connect through this unix socket instead of host:port."""
    db: int = 0
    local_socket: bool = False
    """When host is a loopback address and the server also listens on a unix socket
    this process can open, asyncq's pipelined hot-path connection uses the socket
    (the same server, checked by its ``run_id``): fewer kernel cycles per command.
    Opt-in: ``?local_socket=true`` in the URI. (Not the default: the probe on every
    reconnect delayed recovery after a network partition in the chaos suite.)"""

    def __post_init__(self) -> None:
        self._check_common()
        _check_db(self.db)
        if self.unix_socket_path is None:
            _check_addr(self.host, self.port)
        elif not self.unix_socket_path:
            raise ValueError("unix_socket_path cannot be empty")
        elif self.tls is not None:
            raise ValueError("TLS is not supported over a unix socket")

    def make_client(self) -> Redis:
        """A new redis-py client; no I/O happens until the first command."""
        kwargs = self._socket_kwargs()
        if self.unix_socket_path is not None:
            template = Redis(
                unix_socket_path=self.unix_socket_path,
                db=self.db,
                username=self.username,
                password=self.password,
                **kwargs,
            )
        else:
            template = Redis(
                host=self.host,
                port=self.port,
                db=self.db,
                username=self.username,
                password=self.password,
                **kwargs,
            )
        # redis-py's default pool raises MaxConnectionsError when a hundred handlers
        # write at once; a blocking pool makes them wait their turn instead. The
        # template client (no connection opened) lets redis-py work out the
        # connection class and arguments for TCP, TLS or a unix socket.
        auto = template.connection_pool
        pool = BlockingConnectionPool(
            connection_class=auto.connection_class,
            max_connections=self.pool_size,
            timeout=self.pool_timeout,
            **auto.connection_kwargs,
        )
        return Redis.from_pool(pool)


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisSentinelOpts(_CommonOpts):
    """A master found through Redis Sentinel (asynq's RedisFailoverClientOpt).

    ``username``/``password`` authenticate to the master, ``sentinel_username``/
    ``sentinel_password`` to the sentinels.
    """

    master_name: str
    sentinel_addrs: tuple[tuple[str, int], ...]
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    db: int = 0

    def __post_init__(self) -> None:
        self._check_common()
        _check_db(self.db)
        if not isinstance(self.master_name, str) or not self.master_name.strip():
            raise ValueError("sentinel master name cannot be empty")
        if not self.sentinel_addrs:
            raise ValueError("at least one sentinel address is required")
        for host, port in self.sentinel_addrs:
            _check_addr(host, port)

    def make_client(self) -> Redis:
        """A client that follows the current master across failovers."""
        socket_kwargs = self._socket_kwargs()
        sentinel_kwargs: dict[str, Any] = {
            k: v
            for k, v in socket_kwargs.items()
            if k.startswith(("socket_", "ssl")) or k == "retry"
        }
        sentinel_kwargs["username"] = self.sentinel_username
        sentinel_kwargs["password"] = self.sentinel_password
        sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            list(self.sentinel_addrs),
            sentinel_kwargs=sentinel_kwargs,
            db=self.db,
            username=self.username,
            password=self.password,
            **socket_kwargs,
        )
        # master_for's default pool raises MaxConnectionsError past its limit; the
        # blocking variant waits for a free connection as the redis:// pool does.
        client: Redis = sentinel.master_for(
            self.master_name,
            connection_pool_class=_BlockingSentinelPool,
            max_connections=self.pool_size,
            timeout=self.pool_timeout,
        )
        return client


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisClusterOpts(_CommonOpts):
    """A Redis Cluster reached through any of *addrs* (asynq's RedisClusterClientOpt).

    All of a queue's keys share the ``{queue}`` hash tag, so each broker script
    touches one slot.
    """

    addrs: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        self._check_common()
        if not self.addrs:
            raise ValueError("at least one cluster node address is required")
        for host, port in self.addrs:
            _check_addr(host, port)

    def make_client(self) -> RedisCluster:
        """A cluster client; the slot map is loaded on the first command."""
        return _BlockingCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in self.addrs],
            username=self.username,
            password=self.password,
            max_connections=self.pool_size,
            pool_timeout=self.pool_timeout,
            **self._socket_kwargs(),
        )


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """Sentinel master discovery with a pool that waits for a free connection.

    ``SentinelConnectionPool`` brings the master lookup and the failover
    handling, ``BlockingConnectionPool`` the wait of up to ``timeout`` seconds
    (then ConnectionError) instead of MaxConnectionsError.
    """


# Set while a task holds one of a _BlockingCluster's slots, so that a pipeline
# falling back to single commands (redirections) does not wait for a second one.
_holding_slot: ContextVar[bool] = ContextVar("asyncq_cluster_slot", default=False)


class _BlockingCluster(RedisCluster):
    """A RedisCluster whose callers wait for a connection instead of failing.

    redis-py's cluster nodes raise MaxConnectionsError once ``max_connections``
    are in use. Every command or pipeline uses at most one connection per
    node, so bounding the commands and pipelines in flight to the per-node
    limit means no node ever runs out; callers beyond it wait up to
    ``pool_timeout`` seconds and then get ConnectionError, as with redis://.
    """

    def __init__(self, *, pool_timeout: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._slots = asyncio.Semaphore(int(kwargs["max_connections"]))
        self._pool_timeout = pool_timeout

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        if _holding_slot.get():
            yield
            return
        try:
            async with asyncio.timeout(self._pool_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise RedisConnectionError("No connection available.") from None
        token = _holding_slot.set(True)
        try:
            yield
        finally:
            _holding_slot.reset(token)
            self._slots.release()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self._slot():
            return await super().execute_command(*args, **kwargs)

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> ClusterPipeline:
        pipe = super().pipeline(transaction, shard_hint)
        run = pipe.execute

        async def execute(raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
            async with self._slot():
                return await run(raise_on_error, allow_redirections)

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


def _check_db(db: int) -> None:
    if isinstance(db, bool) or not isinstance(db, int):
        raise TypeError(f"db must be an int, got {db.__class__.__name__}")
    if db < 0:
        raise ValueError(f"database number must be >= 0, got {db}")


def _check_addr(host: str, port: int) -> None:
    if not isinstance(host, str) or not host.strip():
        raise ValueError("redis host cannot be empty")
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"redis port must be an int, got {port.__class__.__name__}")
    if not 0 < port < 65536:
        raise ValueError(f"redis port {port} out of range 1-65535")


RedisConnOpts: TypeAlias = "RedisClientOpts | RedisSentinelOpts | RedisClusterOpts"
"""Parsed connection options: what :func:`parse_redis_uri` returns."""

RedisTarget: TypeAlias = (
    "str | RedisClientOpts | RedisSentinelOpts | RedisClusterOpts | Redis | RedisCluster"
)
"""What :func:`connect` accepts: a URI, parsed options or a ready redis-py client."""

_SCHEMES = ("redis", "rediss", "redis-socket", "redis-sentinel", "redis-cluster")


def parse_redis_uri(uri: str) -> RedisClientOpts | RedisSentinelOpts | RedisClusterOpts:
    """Parse one of asynq's Redis URIs (see the module docstring) into options.

    Raises ValueError naming the problem for an unsupported scheme, a bad
    database number, a missing host or an unknown query parameter.
    """
    if not isinstance(uri, str):
        raise TypeError(f"redis uri must be a str, got {uri.__class__.__name__}")
    scheme, sep, _ = uri.partition("://")
    if not sep:
        raise ValueError(f"invalid redis uri {redact_uri(uri)!r}: expected <scheme>://...")
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise ValueError(
            f"unsupported uri scheme: {scheme!r} "
            "(expected redis, rediss, redis-socket, redis-sentinel or redis-cluster)"
        )
    parts = urlsplit(uri)
    if parts.fragment:
        raise ValueError(f"redis uri must not have a fragment: {redact_uri(uri)!r}")
    # urlsplit's netloc keeps the raw "user:pass@h1:p1,h2:p2"; split it by hand
    # because its .hostname/.port cannot handle host lists.
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, password = _split_userinfo(userinfo)
    query = _parse_query(parts.query, uri)

    if scheme in ("redis", "rediss"):
        _reject_unknown(query, ("local_socket",), uri)
        host, port = _split_host_port(hostlist, DEFAULT_PORT, uri)
        return RedisClientOpts(
            host=host,
            port=port,
            db=_db_from_path(parts.path),
            username=username,
            password=password,
            tls=TLSConfig() if scheme == "rediss" else None,
            local_socket=_parse_bool(query.get("local_socket", "false"), "local_socket"),
        )
    if scheme == "redis-socket":
        _reject_unknown(query, ("db",), uri)
        path = parts.path
        if hostlist:
            # "redis-socket://tmp/redis.sock" would put "tmp" in the host part.
            raise ValueError(
                f"redis socket uri needs an absolute path (redis-socket:///path/to/redis.sock), "
                f"got host {hostlist!r}"
            )
        if not path:
            raise ValueError("could not parse redis socket uri: path does not exist")
        db = 0
        if "db" in query:
            db = _parse_db(query["db"], "query param `db` should be a number")
        return RedisClientOpts(
            unix_socket_path=unquote(path), db=db, username=username, password=password
        )
    if scheme == "redis-sentinel":
        _reject_unknown(query, ("master", "password", "username"), uri)
        master = query.get("master", "")
        if not master.strip():
            raise ValueError(
                "redis sentinel uri needs the master name: redis-sentinel://host:port?master=<name>"
            )
        return RedisSentinelOpts(
            master_name=master,
            sentinel_addrs=_host_list(hostlist, DEFAULT_SENTINEL_PORT, uri),
            sentinel_username=username,
            sentinel_password=password,
            username=query.get("username"),
            password=query.get("password"),
            db=_db_from_path(parts.path),
        )
    # redis-cluster
    _reject_unknown(query, (), uri)
    if parts.path not in ("", "/"):
        raise ValueError("redis cluster uri cannot select a database (cluster mode only has db 0)")
    return RedisClusterOpts(
        addrs=_host_list(hostlist, DEFAULT_PORT, uri), username=username, password=password
    )


def _parse_bool(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"query param `{name}` should be true or false, got {value!r}")


def redact_uri(uri: str) -> str:
    """*uri* with every password replaced by ``***``, for logs and error messages.

    Covers the user-info password (found by the last ``@``, so a password holding
    ``/``, ``?``, ``#`` or ``@`` is hidden whole) and the ``password=`` query
    parameter of sentinel URIs (up to the next ``&``, ``#`` included).
    """
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    rest = _QUERY_PASSWORD.sub(r"\1***", rest)
    at = rest.rfind("@")
    if at != -1:
        userinfo = rest[:at]
        user, colon, _ = userinfo.partition(":")
        if colon:
            rest = f"{user}:***{rest[at:]}"
    return f"{scheme}{sep}{rest}"


_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


def _split_userinfo(userinfo: str) -> tuple[str | None, str | None]:
    if not userinfo:
        return None, None
    user, colon, password = userinfo.partition(":")
    return (unquote(user) or None, unquote(password) if colon else None)


def _parse_query(query: str, uri: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in result:
            raise ValueError(f"query parameter {key!r} given twice in {redact_uri(uri)!r}")
        result[key] = value
    return result


def _reject_unknown(query: dict[str, str], allowed: tuple[str, ...], uri: str) -> None:
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        what = ", ".join(repr(k) for k in unknown)
        hint = f" (supported: {', '.join(allowed)})" if allowed else ""
        raise ValueError(f"unknown query parameter {what} in {redact_uri(uri)!r}{hint}")


def _parse_db(text: str, message: str) -> int:
    try:
        db = int(text, 10)
    except ValueError:
        raise ValueError(f"could not parse redis uri: {message}") from None
    if db < 0:
        raise ValueError(f"could not parse redis uri: database number must be >= 0, got {db}")
    return db


def _db_from_path(path: str) -> int:
    segments = path.strip("/")
    if not segments:
        return 0
    return _parse_db(
        unquote(segments.split("/")[0]), "database number should be the first segment of the path"
    )


def _split_host_port(hostport: str, default_port: int, uri: str) -> tuple[str, int]:
    hostport = hostport.strip()
    if hostport.startswith("["):  # IPv6 literal: [::1]:6379
        host, bracket, rest = hostport[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"invalid IPv6 address {hostport!r} in {redact_uri(uri)!r}")
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = hostport.partition(":")
        if ":" in port_text:
            raise ValueError(
                f"invalid address {hostport!r} in {redact_uri(uri)!r} "
                "(write IPv6 addresses in brackets: [::1]:6379)"
            )
    if not host:
        raise ValueError(f"redis uri is missing a host: {redact_uri(uri)!r}")
    if not port_text:
        return unquote(host), default_port
    try:
        port = int(port_text, 10)
    except ValueError:
        raise ValueError(f"invalid port {port_text!r} in {redact_uri(uri)!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range in {redact_uri(uri)!r}")
    return unquote(host), port


def _host_list(hostlist: str, default_port: int, uri: str) -> tuple[tuple[str, int], ...]:
    if not hostlist.strip():
        raise ValueError(f"redis uri is missing a host: {redact_uri(uri)!r}")
    return tuple(_split_host_port(item, default_port, uri) for item in hostlist.split(","))


def describe_target(target: object) -> str:
    """Where *target* points, for a log line or an error message: the URI without its
    password, the options' address, or a ready client's host, port and database."""
    if isinstance(target, str):
        return redact_uri(target)
    if isinstance(target, RedisClientOpts):
        if target.unix_socket_path:
            return f"redis-socket://{target.unix_socket_path}?db={target.db}"
        return f"redis://{target.host}:{target.port}/{target.db}"
    if isinstance(target, RedisSentinelOpts):
        addrs = ",".join(f"{host}:{port}" for host, port in target.sentinel_addrs)
        return f"redis-sentinel://{addrs}/{target.db}?master={target.master_name}"
    if isinstance(target, RedisClusterOpts):
        return "redis-cluster://" + ",".join(f"{host}:{port}" for host, port in target.addrs)
    pool = getattr(target, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict):
        if kwargs.get("path"):
            return f"redis-socket://{kwargs['path']}?db={kwargs.get('db', 0)}"
        host, port = kwargs.get("host", "localhost"), kwargs.get("port", DEFAULT_PORT)
        return f"redis://{host}:{port}/{kwargs.get('db', 0)}"
    return type(target).__name__
