"""``asyncq worker module:app``: run a worker server for an App or a ServeMux."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import click
from redis.exceptions import RedisError

from asyncq._redis.options import redact_uri
from asyncq.app import App
from asyncq.cli._app import (
    ENV_URI,
    LOG_LEVELS,
    CliError,
    configure_logging,
    run_async,
    settings,
)
from asyncq.mux import ServeMux

__all__ = ["load_app", "parse_queues", "worker"]


def parse_queues(text: str) -> dict[str, int]:
    """``critical=6,default=3`` -> {"critical": 6, "default": 3}; a bare name has priority 1."""
    queues: dict[str, int] = {}
    for item in text.split(","):
        name, sep, prio = item.strip().partition("=")
        name = name.strip()
        if not name:
            raise ValueError(f"invalid queue list {text!r}: empty queue name")
        if not sep:
            priority = 1
        else:
            try:
                priority = int(prio.strip())
            except ValueError:
                raise ValueError(
                    f"invalid priority {prio.strip()!r} for queue {name!r}: expected an integer"
                ) from None
            if priority < 1:
                raise ValueError(f"priority of queue {name!r} must be 1 or more, got {priority}")
        if name in queues:
            raise ValueError(f"queue {name!r} is listed twice")
        queues[name] = priority
    return queues


def load_app(spec: str) -> ServeMux | App[Any] | Coroutine[Any, Any, ServeMux | App[Any]]:
    """Import ``module:attr`` (attr defaults to ``app``) and return its App or ServeMux.

    The attribute may be an App, a ServeMux, or a zero-argument callable
    returning one; an async factory gives a coroutine to await in the
    worker's event loop. Raises CliError naming the problem.
    """
    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    if not module_name or not all(part.isidentifier() for part in attr.split(".")):
        raise CliError(f"invalid app {spec!r}: expected MODULE:ATTRIBUTE, e.g. myapp.tasks:mux")
    # Like uvicorn and arq: modules in the current directory are importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise CliError(
                f"cannot import module {module_name!r}: no module named {exc.name!r}"
            ) from None
        raise CliError(f"cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:
        if os.environ.get("ASYNCQ_DEBUG"):
            raise
        raise CliError(
            f"cannot import module {module_name!r}: {exc.__class__.__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, ServeMux | App):
        return obj
    if callable(obj) and _takes_no_arguments(obj):
        made = obj()
        if inspect.iscoroutine(made):
            return _made_by(spec, made)
        return _check_made(spec, made)
    raise CliError(
        f"{spec} is a {obj.__class__.__name__}; expected an asyncq App or ServeMux "
        "or a zero-argument (sync or async) callable returning one"
    )


async def _made_by(spec: str, factory: Coroutine[Any, Any, Any]) -> ServeMux | App[Any]:
    return _check_made(spec, await factory)


def _check_made(spec: str, made: object) -> ServeMux | App[Any]:
    if isinstance(made, ServeMux | App):
        return made
    raise CliError(f"{spec} returned {made.__class__.__name__}, expected an asyncq App or ServeMux")


def _takes_no_arguments(fn: Any) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in sig.parameters.values()
    )


if TYPE_CHECKING:  # click >= 8.2 types ParamType by its value; older clicks are not generic
    _QueuesParam = click.ParamType[dict[str, int], Any]
else:
    _QueuesParam = click.ParamType


class QueuesType(_QueuesParam):
    name = "queues"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, dict):
            return value
        try:
            return parse_queues(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.command(short_help="Run a worker for an App or ServeMux (MODULE:APP).")
@click.argument("app", metavar="MODULE:APP")
@click.option(
    "--concurrency", "-c", type=click.IntRange(min=1), help="Tasks run at once [default: CPUs]."
)
@click.option(
    "--queues",
    "-q",
    type=QueuesType(),
    metavar="NAME=PRIORITY,...",
    help="Queues and their weights, e.g. critical=6,default=3 [default: default=1].",
)
@click.option("--strict", is_flag=True, help="Strict priority: empty higher queues first.")
@click.option("--burst", is_flag=True, help="Exit once the queues are empty.")
@click.option("--uri", "-u", "worker_uri", metavar="URL", help="Redis URL (overrides the global).")
@click.option(
    "--log-level",
    type=click.Choice(list(LOG_LEVELS), case_sensitive=False),
    default="info",
    show_default=True,
    help="Least severe log level written to stderr.",
)
@click.pass_context
def worker(
    ctx: click.Context,
    *,
    app: str,
    concurrency: int | None,
    queues: dict[str, int] | None,
    strict: bool,
    burst: bool,
    worker_uri: str | None,
    log_level: str,
) -> None:
    """Run a worker for MODULE:APP: an asyncq App, a ServeMux, or a (sync or async)
    function returning one. Uses uvloop when it is installed. An App's worker
    connects to the App's Redis unless --uri, $ASYNCQ_REDIS_URL or the config
    file name one.

    SIGTERM/SIGINT shut down gracefully (a second one exits at once); SIGTSTP
    stops fetching new tasks.

    \b
    Example:
      asyncq worker myapp.tasks:mux -c 20 -q critical=6,default=3
    """
    from asyncq.server import Server

    configure_logging(log_level.lower())
    target = load_app(app)
    cli = settings(ctx)
    if worker_uri is not None:
        cli.uri_flag = worker_uri
    options: dict[str, Any] = {
        "concurrency": concurrency,
        "queues": queues,
        "strict_priority": strict,
        "burst": burst,
    }

    def build(loaded: ServeMux | App[Any]) -> tuple[str, Server, ServeMux]:
        if isinstance(loaded, ServeMux):
            uri = cli.uri()
            return uri, Server(uri, **options), loaded
        given = cli.uri_flag or os.environ.get(ENV_URI) or cli.config().get("uri")
        if given is None and isinstance(loaded.redis, str):
            # No --uri, $ASYNCQ_REDIS_URL or config file: the App's own Redis.
            return loaded.redis, loaded.server(**options), loaded.mux
        uri = cli.uri()
        return uri, Server(uri, lifespan=loaded.lifespan, **options), loaded.mux

    async def serve(uri: str, server: Server, mux: ServeMux) -> None:
        try:
            await server.ping()
        except BaseException:
            await server.shutdown()
            raise
        await server.run(mux)

    if isinstance(target, ServeMux | App):
        uri, server, mux = build(target)
        run_async(uri, lambda: serve(uri, server, mux), uvloop=True)
        return
    factory = target

    async def from_factory() -> None:
        # An async factory runs in the worker's own event loop, so what it opens stays usable.
        uri, server, mux = build(await factory)
        try:
            await server.ping()
        except BaseException as exc:
            await server.shutdown()
            if isinstance(exc, RedisError | OSError):
                raise CliError(f"cannot connect to Redis at {redact_uri(uri)}: {exc}") from None
            raise
        await server.run(mux)

    run_async(cli.uri(), from_factory, uvloop=True)
