"""``asyncq worker module:app``: run a worker server for an App or a ServeMux."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from redis.exceptions import RedisError

from asyncq._redis.options import redact_uri
from asyncq._worker.config import Intervals, Limits
from asyncq._worker.queueset import is_pattern, validate_pattern
from asyncq.app import App, WorkerOptions
from asyncq.cli._app import (
    ENV_URI,
    LOG_LEVELS,
    CliError,
    configure_logging,
    run_async,
    settings,
)
from asyncq.cli._commands import DURATION
from asyncq.cli._extras import require_extra
from asyncq.cli.limits import LimitsType
from asyncq.cli.supervisor import (
    EXIT_CANNOT_CONNECT,
    SUPERVISOR_ENV,
    Supervisor,
    watch_supervisor,
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
        if is_pattern(name):
            validate_pattern("queues", name)
        queues[name] = priority
    return queues


def load_app(spec: str) -> ServeMux | App[Any] | Coroutine[Any, Any, ServeMux | App[Any]]:
    """Import ``module:attr`` (attr defaults to ``app``) and return its App or ServeMux.

    The attribute may be an App, a ServeMux, or a zero-argument callable
    returning one; an async factory gives a coroutine to await in the
    worker's event loop. Raises CliError naming the problem.
    """
    module_name, _, attr = spec.partition(":")
    attr_given = bool(attr)
    attr = attr or "app"
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        path = Path(module_name.removesuffix(".py"))
        dotted = ".".join(p for p in path.parts if p not in (".", path.anchor))
        raise CliError(
            f"invalid app {spec!r}: give a module name, not a file path "
            f"(e.g. {dotted}:{attr}, run from the directory that holds it)"
        )
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
            raise CliError(
                f"module {module_name!r} has no attribute {attr!r}"
                + _app_hint(module, module_name, attr_given=attr_given)
            ) from None
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


def _app_hint(module: Any, module_name: str, *, attr_given: bool) -> str:
    """Where the ServeMux probably is: the module's ServeMux attributes, and the form to use."""
    muxes = sorted(n for n, v in vars(module).items() if isinstance(v, ServeMux))
    if muxes:
        found = ", ".join(f"{module_name}:{n}" for n in muxes)
        return f"; it has a ServeMux: use {found}"
    if not attr_given:
        return f"; give the ServeMux as MODULE:APP, e.g. {module_name}:mux"
    return ""


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


def add_http_targets(mux: ServeMux, specs: tuple[str, ...], secret: str | None) -> list[Any]:
    """Register ``PATTERN=URL`` HTTP targets on *mux*; CliError names what is wrong."""
    from asyncq.cli.gateway import require_extra

    require_extra("--http-target")
    from asyncq.gateway import add_http_targets as add
    from asyncq.gateway import parse_http_target

    if not secret:
        raise CliError("--http-target needs --http-target-secret (or $ASYNCQ_HTTP_TARGET_SECRET)")
    try:
        targets = dict(parse_http_target(spec) for spec in specs)
        return add(mux, targets, secret=secret)
    except ValueError as exc:
        raise CliError(str(exc)) from None


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
@click.argument("app", metavar="[MODULE:APP]", required=False)
@click.option(
    "--concurrency", "-c", type=click.IntRange(min=1), help="Tasks run at once [default: CPUs]."
)
@click.option(
    "--queues",
    "-q",
    type=QueuesType(),
    metavar="NAME=PRIORITY,...",
    help="Queues and their weights, e.g. critical=6,default=3 [default: an App's queues "
    "setting, else default and every queue its tasks declare; a ServeMux: default=1]. "
    "A NAME with * ? [..] is a pattern served for every matching queue, also ones "
    "created later, e.g. 'tenant:*=1,critical=5'.",
)
@click.option(
    "--queue-concurrency",
    type=LimitsType(),
    metavar="NAME=N,...",
    help="Fleet-wide limit of running tasks per queue, e.g. partner=2; a NAME pattern "
    "(tenant:*=1) limits each matching queue.",
)
@click.option(
    "--local-queue-concurrency",
    type=LimitsType(),
    metavar="NAME=N,...",
    help="Limit of running tasks per queue in this worker alone.",
)
@click.option(
    "--rate-limit",
    "rate_limits",
    multiple=True,
    metavar="NAME=N/PERIOD",
    help="Fleet-wide rate limit of a queue (token bucket in Redis), e.g. email=100/s; "
    "'partner=10/s burst 1' holds 1 token instead of 10 (at most 10 starts in any "
    "second, instead of up to 19); "
    "NAME may be a pattern (tenant:*=10/s: each matching queue); repeatable.",
)
@click.option(
    "--type-rate-limit",
    "type_rate_limits",
    multiple=True,
    metavar="TYPE=N/PERIOD",
    help="Fleet-wide rate limit of a task type, e.g. api:partner=600/min "
    "(optionally 'burst B', as --rate-limit); repeatable.",
)
@click.option(
    "--strict/--no-strict",
    default=None,
    help="Strict priority: empty higher queues first [default: the App's setting, else no].",
)
@click.option("--burst", is_flag=True, help="Exit once the queues are empty.")
@click.option(
    "--metrics-history/--no-metrics-history",
    default=None,
    help="Keep the per-minute metrics history of each task type in Redis (24 h; read by "
    "'asyncq metrics top' and the web UI's Metrics page) [default: the App's setting, "
    "else on].",
)
@click.option("--uri", "-u", "worker_uri", metavar="URL", help="Redis URL (overrides the global).")
@click.option(
    "--log-level",
    type=click.Choice(list(LOG_LEVELS), case_sensitive=False),
    default="info",
    show_default=True,
    help="Least severe log level written to stderr.",
)
@click.option(
    "--shutdown-timeout",
    type=DURATION,
    metavar="DURATION",
    help="At SIGTERM/SIGINT, wait this long for running tasks before requeueing them, "
    "e.g. 25s [default: 8s].",
)
@click.option(
    "--lease-duration",
    type=DURATION,
    metavar="DURATION",
    help="How long a task stays leased to this worker without a heartbeat; a killed "
    "worker's tasks run again elsewhere about this long plus --recoverer-cutoff after "
    "the kill [default: 30s].",
)
@click.option(
    "--heartbeat-interval",
    type=DURATION,
    metavar="DURATION",
    help="How often the worker extends its leases and writes its state; shorter than "
    "--lease-duration [default: 5s].",
)
@click.option(
    "--recoverer-interval",
    type=DURATION,
    metavar="DURATION",
    help="Longest time between two checks for expired leases; the recoverer also "
    "checks at the earliest lease expiry [default: 1m].",
)
@click.option(
    "--recoverer-cutoff",
    type=DURATION,
    metavar="DURATION",
    help="How long after its expiry a lease is recovered (allowance for clock skew "
    "between hosts) [default: 2s].",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(min=1),
    help="Run N worker processes under a supervisor that restarts crashed ones "
    "and forwards SIGTERM/SIGINT/SIGTSTP [default: one worker, no supervisor].",
)
@click.option(
    "--reload",
    is_flag=True,
    help="Restart the worker processes when a .py file under the current directory "
    "changes (development only; needs the 'reload' extra).",
)
@click.option(
    "--loop",
    type=click.Choice(["auto", "asyncio", "uvloop"]),
    default="auto",
    show_default=True,
    help="Event loop: auto uses uvloop when it is installed (the 'uvloop' extra).",
)
@click.option(
    "--http-target",
    "http_targets",
    multiple=True,
    metavar="PATTERN=URL",
    help="Deliver tasks whose type matches PATTERN (e.g. 'php:*') to URL by HTTP POST; repeatable.",
)
@click.option(
    "--http-target-secret",
    envvar="ASYNCQ_HTTP_TARGET_SECRET",
    metavar="SECRET",
    help="HMAC secret signing HTTP-target requests [env: ASYNCQ_HTTP_TARGET_SECRET].",
)
@click.pass_context
def worker(
    ctx: click.Context,
    *,
    app: str | None,
    concurrency: int | None,
    queues: dict[str, int] | None,
    queue_concurrency: dict[str, int] | None,
    local_queue_concurrency: dict[str, int] | None,
    rate_limits: tuple[str, ...],
    type_rate_limits: tuple[str, ...],
    strict: bool | None,
    burst: bool,
    metrics_history: bool | None,
    worker_uri: str | None,
    log_level: str,
    shutdown_timeout: timedelta | None,
    lease_duration: timedelta | None,
    heartbeat_interval: timedelta | None,
    recoverer_interval: timedelta | None,
    recoverer_cutoff: timedelta | None,
    processes: int | None,
    reload: bool,
    loop: str,
    http_targets: tuple[str, ...],
    http_target_secret: str | None,
) -> None:
    """Run a worker for MODULE:APP: an asyncq App, a ServeMux, or a (sync or async)
    function returning one. Uses uvloop when it is installed. An App's worker
    connects to the App's Redis unless --uri, $ASYNCQ_REDIS_URL or the config
    file name one.

    With --http-target, tasks of matching types go to HTTP endpoints (any
    language; see the gateway docs); MODULE:APP may then be left out.

    SIGTERM/SIGINT shut down gracefully (a second one exits at once); SIGTSTP
    stops fetching new tasks. With --processes N a supervisor runs N worker
    processes, restarts one that crashes (with backoff) and forwards these
    signals to all of them.

    \b
    Examples:
      asyncq worker myapp.tasks:mux -c 20 -q critical=6,default=3
      asyncq worker myapp.tasks:mux --processes 4      # production, one per core
      asyncq worker myapp.tasks:mux --reload           # development
      asyncq worker --http-target 'php:*=http://php-app.internal/tasks'
    """
    from asyncq._worker.server import Server

    configure_logging(log_level.lower())
    rates = _rates(rate_limits)
    type_rates = _rates(type_rate_limits, option="--type-rate-limit")
    if app is None and not http_targets:
        raise click.UsageError("give MODULE:APP, --http-target PATTERN=URL, or both")
    target = load_app(app) if app is not None else ServeMux()
    cli = settings(ctx)
    if worker_uri is not None:
        cli.uri_flag = worker_uri
    loop_factory = _loop_factory(loop)
    given = {
        "shutdown_timeout": shutdown_timeout,
        "lease_duration": lease_duration,
        "heartbeat_interval": heartbeat_interval,
        "recoverer_interval": recoverer_interval,
        "recoverer_cutoff": recoverer_cutoff,
    }
    timings = {name: value for name, value in given.items() if value is not None}
    if processes is not None or reload:
        _supervise(
            app,
            # Without -u the workers resolve the URI as this process would.
            cli.uri() if cli.uri_flag is not None else None,
            processes=processes or 1,
            reload=reload,
            concurrency=concurrency,
            queues=queues,
            limits={
                "--queue-concurrency": queue_concurrency,
                "--local-queue-concurrency": local_queue_concurrency,
            },
            rate_limits=rate_limits,
            type_rate_limits=type_rate_limits,
            strict=strict,
            burst=burst,
            metrics_history=metrics_history,
            log_level=log_level.lower(),
            loop=loop,
            timings=timings,
            http_targets=http_targets,
            http_target_secret=http_target_secret,
        )
        return
    supervisor_pid = os.environ.get(SUPERVISOR_ENV, "")
    if supervisor_pid.isdigit():  # started by a supervisor: end when it is gone
        watch_supervisor(int(supervisor_pid))
    # Only the flags given: they override an App's worker settings one by one (a group's
    # fields too: the App's other fields of the group stay, see App.worker_settings).
    options: WorkerOptions = {}
    if concurrency is not None:
        options["concurrency"] = concurrency
    if queues is not None:
        options["queues"] = queues
    if strict is not None:
        options["strict_priority"] = strict
    if burst:
        options["burst"] = True
    if metrics_history is not None:
        options["metrics_history"] = metrics_history
    if shutdown_timeout is not None:
        options["shutdown_timeout"] = shutdown_timeout
    if lease_duration is not None:
        options["lease_duration"] = lease_duration
    if queue_concurrency or local_queue_concurrency or rates or type_rates:
        options["limits"] = Limits(
            queue_concurrency=queue_concurrency or None,
            local_queue_concurrency=local_queue_concurrency or None,
            rate_limits=rates or None,
            type_rate_limits=type_rates or None,
        )
    intervals = {
        "heartbeat": heartbeat_interval,
        "recoverer": recoverer_interval,
        "recoverer_cutoff": recoverer_cutoff,
    }
    if any(value is not None for value in intervals.values()):
        options["intervals"] = Intervals(**{k: v for k, v in intervals.items() if v is not None})

    def build(loaded: ServeMux | App[Any]) -> tuple[str, Server, ServeMux]:
        if isinstance(loaded, ServeMux):
            uri = cli.uri()
            return uri, Server(uri, **options), loaded
        given = cli.uri_flag or os.environ.get(ENV_URI) or cli.config().get("uri")
        if given is None and isinstance(loaded.redis, str):
            # No --uri, $ASYNCQ_REDIS_URL or config file: the App's own Redis.
            return loaded.redis, loaded.server(**options), loaded.mux
        uri = cli.uri()
        return uri, loaded.server(redis=uri, **options), loaded.mux

    async def serve(loaded: ServeMux | App[Any]) -> None:
        uri, server, mux = build(loaded)
        closers = add_http_targets(mux, http_targets, http_target_secret) if http_targets else []
        try:
            try:
                await server.ping()
            except BaseException as exc:
                await server.shutdown()
                if isinstance(exc, RedisError | OSError):
                    supervised = os.environ.get(SUPERVISOR_ENV, "").isdigit()
                    kind = _CannotConnectSupervised if supervised else CliError
                    raise kind(f"cannot connect to Redis at {redact_uri(uri)}: {exc}") from None
                raise
            if supervisor_pid.isdigit():  # the supervisor prints the signal hints once
                server._announce_signals = False
            await server.run(mux)
        finally:
            for closer in closers:
                await closer.aclose()

    async def go() -> None:
        # An async factory runs in the worker's own event loop, so what it opens stays usable.
        await serve(target if isinstance(target, ServeMux | App) else await target)

    run_async(cli.uri(), go, loop_factory=loop_factory)


class _CannotConnectSupervised(CliError):
    """A supervised worker that cannot reach Redis at start: not restarted (supervisor)."""

    exit_code = EXIT_CANNOT_CONNECT


def _loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop factory for --loop (None: asyncio's default loop)."""
    if loop == "asyncio":
        return None
    if loop == "uvloop":
        uvloop = require_extra("uvloop", "uvloop", "--loop uvloop")
    else:
        try:
            import uvloop
        except ImportError:
            return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _rates(items: tuple[str, ...], option: str = "--rate-limit") -> dict[str, str]:
    """``--rate-limit NAME=N/PERIOD`` (or ``--type-rate-limit``) values as ``{name: rate}``,
    checked now."""
    from asyncq._worker.limits import validate_rates, validate_type_rates

    out: dict[str, str] = {}
    for item in items:
        # A rate holds no "=": split at the last one, so the name may hold one.
        name, sep, rate = item.rpartition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"expected NAME=N/PERIOD, got {item!r}", param_hint=option)
        out[name.strip()] = rate.strip()
    validate = validate_rates if option == "--rate-limit" else validate_type_rates
    try:
        validate(option, out)
    except ValueError as exc:
        # click names the option itself ("Invalid value for --rate-limit: ..."): once is enough.
        problem = str(exc).removeprefix(f"{option}: ")
        raise click.BadParameter(problem, param_hint=option) from None
    return out


def _supervise(
    app: str | None,
    uri: str | None,
    *,
    processes: int,
    reload: bool,
    concurrency: int | None,
    queues: dict[str, int] | None,
    limits: dict[str, dict[str, int] | None],
    rate_limits: tuple[str, ...],
    type_rate_limits: tuple[str, ...],
    strict: bool | None,
    burst: bool,
    metrics_history: bool | None,
    log_level: str,
    loop: str,
    timings: dict[str, timedelta],
    http_targets: tuple[str, ...],
    http_target_secret: str | None,
) -> None:
    """Run the worker as *processes* supervised subprocesses (see asyncq.cli.supervisor)."""
    if reload:
        require_extra("watchfiles", "reload", "--reload")
    argv = [sys.executable, "-m", "asyncq.cli", "worker", *([app] if app else [])]
    argv += ["--log-level", log_level]
    for target in http_targets:
        argv += ["--http-target", target]
    argv += ["--loop", loop]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    if queues is not None:
        argv += ["--queues", ",".join(f"{name}={prio}" for name, prio in queues.items())]
    for flag, limit in limits.items():
        if limit:
            argv += [flag, ",".join(f"{name}={n}" for name, n in limit.items())]
    for rate in rate_limits:
        argv += ["--rate-limit", rate]
    for rate in type_rate_limits:
        argv += ["--type-rate-limit", rate]
    for name, value in timings.items():  # shutdown_timeout, lease_duration, ...
        argv += [f"--{name.replace('_', '-')}", f"{round(value.total_seconds() * 1000)}ms"]
    if strict is not None:
        argv.append("--strict" if strict else "--no-strict")
    if burst:
        argv.append("--burst")
    if metrics_history is not None:
        argv.append("--metrics-history" if metrics_history else "--no-metrics-history")
    # The URL goes by environment, not argv, so that `ps` does not show its password.
    env = dict(os.environ)
    if uri is not None:
        env[ENV_URI] = uri
    if http_target_secret is not None:  # likewise the signing secret
        env["ASYNCQ_HTTP_TARGET_SECRET"] = http_target_secret
    supervisor = Supervisor(
        argv, processes, env=env, burst=burst, reload_dir=Path.cwd() if reload else None
    )
    status = asyncio.run(supervisor.run())
    if supervisor.cannot_connect:
        where = redact_uri(uri) if uri is not None else "the App's Redis"
        raise CliError(f"the worker processes cannot connect to Redis at {where} (log above)")
    if status:
        raise CliError("a worker process exited with an error; see the log above")
