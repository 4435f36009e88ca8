"""``asyncq worker module:app``: run a worker server for a ServeMux."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from asyncq.cli._app import LOG_LEVELS, CliError, configure_logging, run_async, settings
from asyncq.cli.flow import LimitsType
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


def load_app(spec: str) -> ServeMux:
    """Import ``module:attr`` (attr defaults to ``app``) and return its ServeMux.

    The attribute may be a ServeMux or a zero-argument callable returning one.
    Raises CliError naming the problem.
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
    if isinstance(obj, ServeMux):
        return obj
    if callable(obj) and _takes_no_arguments(obj):
        made = obj()
        if isinstance(made, ServeMux):
            return made
        raise CliError(
            f"{spec} returned {made.__class__.__name__}, expected an asyncq.mux.ServeMux"
        )
    raise CliError(
        f"{spec} is a {obj.__class__.__name__}; expected an asyncq.mux.ServeMux "
        "or a zero-argument callable returning one"
    )


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


@click.command(short_help="Run a worker for a ServeMux (MODULE:APP).")
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
@click.option(
    "--queue-concurrency",
    type=LimitsType(),
    metavar="NAME=N,...",
    help="Fleet-wide limit of running tasks per queue, e.g. partner=2.",
)
@click.option(
    "--local-queue-concurrency",
    type=LimitsType(),
    metavar="NAME=N,...",
    help="Limit of running tasks per queue in this worker alone.",
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
    queue_concurrency: dict[str, int] | None,
    local_queue_concurrency: dict[str, int] | None,
    strict: bool,
    burst: bool,
    worker_uri: str | None,
    log_level: str,
) -> None:
    """Run a worker for the ServeMux MODULE:APP (a ServeMux or a function returning one).

    SIGTERM/SIGINT shut down gracefully (a second one exits at once); SIGTSTP
    stops fetching new tasks.

    \b
    Example:
      asyncq worker myapp.tasks:mux -c 20 -q critical=6,default=3
    """
    from asyncq.server import Server

    configure_logging(log_level.lower())
    mux = load_app(app)
    if worker_uri is not None:
        settings(ctx).uri_flag = worker_uri
    uri = settings(ctx).uri()
    server = Server(
        uri,
        concurrency=concurrency,
        queues=queues,
        strict_priority=strict,
        burst=burst,
        queue_concurrency=queue_concurrency,
        local_queue_concurrency=local_queue_concurrency,
    )

    async def go() -> None:
        try:
            await server.ping()
        except BaseException:
            await server.shutdown()
            raise
        await server.run(mux)

    run_async(uri, go)
