from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
import structlog
from hypothesis import Phase, settings
from redis.asyncio import Redis

from asyncq import Server
from asyncq._broker import Broker
from asyncq._producer.client import Client
from tests.support.cluster import RedisClusterProcs
from tests.support.helpers import FakeClock
from tests.support.procs import FAST
from tests.support.redis_server import RedisServer

_SLOW_TOO = ("subprocess", "cluster", "sentinel")

# Property tests: the default suite searches the same examples on every run and machine
# (a failure is reproducible and CI has no dice); `nox -s fuzz` runs the `fuzz` profile,
# a longer randomized search. Tests that set max_examples keep it under both profiles.
settings.register_profile("default", derandomize=True, print_blob=True)
settings.register_profile("fuzz", derandomize=False, max_examples=500, print_blob=True)
# The Lua mutation run (tests/mutation): the default examples, no shrinking (a kill is
# all it needs to know, and shrinking a stateful failure costs minutes).
settings.register_profile(
    "mutation", derandomize=True, phases=(Phase.explicit, Phase.reuse, Phase.generate)
)
settings.load_profile(os.environ.get("ASYNCQ_HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start processes or multi-server setups are slow as well."""
    for item in items:
        if any(item.get_closest_marker(name) for name in _SLOW_TOO):
            item.add_marker(pytest.mark.slow)


# The asyncq plugin is loaded here, not by its entry point (-p no:asyncq in
# pyproject): an entry-point plugin imports asyncq before coverage starts.
pytest_plugins = ["pytester", "asyncq.testing.pytest_plugin"]


@pytest.fixture(autouse=True)
def _structlog_as_unconfigured() -> Iterator[None]:
    """Each test ends with structlog as an application that configured nothing leaves it.

    ``structlog.testing.capture_logs`` (and the CLI run in-process) leave structlog marked
    as configured; asyncq's loggers would then use structlog's defaults for every later
    test in the process (every level, on stdout, tracebacks with each frame's locals),
    which made a test's output and time depend on the tests run before it.
    """
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis the tests may flush: a throwaway server, or ASYNCQ_TEST_REDIS_URL."""
    env = os.environ.get("ASYNCQ_TEST_REDIS_URL")
    if env:
        yield env
        return
    server = RedisServer().start()
    try:
        yield server.url
        report = os.environ.get("ASYNCQ_SCRIPTS_REPORT")
        if report:
            _RAN_LUA.update(_loaded_lua_files(server.url))
            with open(report, "a", encoding="utf-8") as out:
                out.writelines(f"{name}\n" for name in sorted(_RAN_LUA))
    finally:
        server.cleanup()


_RAN_LUA: set[str] = set()


@pytest.fixture(autouse=True)
def _record_lua_files(request: pytest.FixtureRequest) -> Iterator[None]:
    """With ASYNCQ_SCRIPTS_REPORT set, note after each test which scripts its server ran
    (a test that flushes the scripts would otherwise hide the ones before it)."""
    yield
    if os.environ.get("ASYNCQ_SCRIPTS_REPORT") and "redis_url" in request.fixturenames:
        _RAN_LUA.update(_loaded_lua_files(request.getfixturevalue("redis_url")))


def _loaded_lua_files(url: str) -> set[str]:
    """The names of the ``.lua`` files whose code the server at *url* has loaded
    (``nox -s servers`` checks that its subset runs every script on every server).

    A script is loaded on its first call and FLUSHDB keeps it. Some scripts are
    composed of several files (a function defined before a body), so a file counts
    when its source, includes expanded, is part of a loaded script.
    """
    import gc

    import redis as sync_redis

    import asyncq._broker  # every module that defines a script
    from asyncq._redis.scripts import Script, read_script

    del asyncq
    # A started Server froze the heap (gc.freeze, asyncq._worker.server), and frozen
    # objects are not in gc.get_objects(): thaw them (only a speed-up, in a test process).
    gc.unfreeze()
    # Looked up each time: some composed scripts are made on first use.
    scripts = {o.sha: o for o in gc.get_objects() if isinstance(o, Script)}
    client = sync_redis.Redis.from_url(url)
    try:
        loaded = client.script_exists(*scripts) if scripts else []
    finally:
        client.close()
    ran = [s.source for s, ok in zip(scripts.values(), loaded, strict=True) if ok]
    lua = Path(__file__).resolve().parent.parent / "asyncq" / "_broker" / "lua"
    return {
        f.stem
        for f in lua.glob("*.lua")
        if any(read_script("asyncq._broker", f.stem) in r for r in ran)
    }


@pytest.fixture(scope="session")
def cluster() -> Iterator[RedisClusterProcs]:
    """A three-master Redis Cluster for the tests that need one (started on first use)."""
    procs = RedisClusterProcs(3).start()
    try:
        yield procs
    finally:
        procs.cleanup()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A raw redis-py client on a flushed database (bytes responses)."""
    client = Redis.from_url(redis_url)
    await client.flushdb()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def r(redis_url: str) -> Iterator[sync_redis.Redis]:
    """A synchronous redis-py client on a flushed database (bytes responses), for tests
    that are not coroutines (a CLI run, a subprocess, hypothesis)."""
    client = sync_redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(float(int(time.time())))


@pytest.fixture
async def broker(redis: Redis, clock: FakeClock) -> Broker:
    """A Broker on the flushed test database, on the fake clock."""
    return Broker(redis, clock=clock)


@pytest.fixture
async def serve(
    redis: Redis, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    """``await serve(mux, **options)`` starts a Server on the test Redis with fast timings
    (the module's ``SERVE_CONCURRENCY``, default 4, unless given); all shut down at the end.
    An ``intervals`` given replaces the fast ones whole: change some with ``**fast(...)``."""
    servers: list[Server] = []
    concurrency = getattr(request.module, "SERVE_CONCURRENCY", 4)

    async def start(mux: Any, **options: Any) -> Server:
        server = Server(redis, **{"concurrency": concurrency, **FAST, **options})
        servers.append(server)
        await server.start(mux)
        return server

    yield start
    for server in servers:
        await server.shutdown()


@pytest.fixture
async def client(redis: Redis) -> AsyncIterator[Client]:
    """An asyncq Client sharing the test's redis-py client."""
    async with Client(redis) as c:
        yield c
