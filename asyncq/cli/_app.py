"""The ``asyncq`` command group: global options, configuration and one-line errors."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tomllib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import structlog
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncq._redis.options import redact_uri
from asyncq.errors import AsyncqError

__all__ = ["CliError", "Settings", "main", "run_async"]

T = TypeVar("T")

ENV_URI = "ASYNCQ_REDIS_URL"
DEFAULT_URI = "redis://127.0.0.1:6379/0"
DEFAULT_CONFIG = Path("~/.asyncq.toml")
CONFIG_KEYS = ("uri",)


class CliError(click.ClickException):
    """A problem reported as one ``error: ...`` line with exit status 1."""


@dataclass(slots=True)
class Settings:
    """Global options; the Redis URI is resolved only when a command needs Redis."""

    uri_flag: str | None
    config_path: str | None

    def config(self) -> dict[str, Any]:
        """The config file's settings ({} when there is none)."""
        if self.config_path is not None:
            path = Path(self.config_path).expanduser()
            if not path.is_file():
                raise CliError(f"config file not found: {path}")
        else:
            path = DEFAULT_CONFIG.expanduser()
            if not path.is_file():
                return {}
        try:
            data = tomllib.loads(path.read_text("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise CliError(f"cannot read config file {path}: {exc}") from None
        unknown = sorted(set(data) - set(CONFIG_KEYS))
        if unknown:
            raise CliError(
                f"unknown key(s) {', '.join(unknown)} in config file {path} "
                f"(known: {', '.join(CONFIG_KEYS)})"
            )
        if "uri" in data and not isinstance(data["uri"], str):
            raise CliError(f"config file {path}: uri must be a string")
        return data

    def uri(self) -> str:
        """The Redis URI: --uri, then $ASYNCQ_REDIS_URL, then the config file, then the default."""
        from asyncq._redis.options import parse_redis_uri

        if self.uri_flag is not None and not self.uri_flag.strip():
            raise CliError("--uri/-u is empty: give a Redis URI such as redis://localhost:6379/0")
        uri = self.uri_flag or os.environ.get(ENV_URI) or self.config().get("uri") or DEFAULT_URI
        try:
            parse_redis_uri(uri)
        except ValueError as exc:
            # The parser's message may already name the URI (redacted); say it once.
            reason = str(exc).removeprefix(f"invalid redis uri {redact_uri(uri)!r}: ")
            raise CliError(f"invalid Redis URI {redact_uri(uri)!r}: {reason}") from None
        return str(uri)


def settings(ctx: click.Context) -> Settings:
    """The Settings of the running command."""
    obj = ctx.find_object(Settings)
    if obj is None:  # a subcommand invoked on its own, e.g. in tests
        obj = Settings(None, None)
    return obj


def run_async(
    uri: str,
    fn: Callable[[], Awaitable[T]],
    *,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """Run *fn* in a fresh event loop, naming *uri* if Redis cannot be reached."""

    async def runner() -> T:
        return await fn()

    try:
        with asyncio.Runner(loop_factory=loop_factory) as loop_runner:
            return loop_runner.run(runner())
    except AuthenticationError as exc:
        raise CliError(f"Redis at {redact_uri(uri)} refused the credentials: {exc}") from None
    except (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError) as exc:
        raise CliError(f"cannot connect to Redis at {redact_uri(uri)}: {exc}") from None


LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def configure_logging(level: str) -> None:
    """Send asyncq's structlog events at *level* and above to stderr (stdout stays data)."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LOG_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


class _ToStructlog(logging.Handler):
    """Hands a stdlib logger's records to structlog, so that a library's lines (uvicorn's
    "Started server process", ...) come out in the same format as asyncq's own."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a library's bad format string must not break the server
            message = str(record.msg)
        log = structlog.get_logger()
        level = record.levelname.lower()
        method = getattr(log, level if level in ("debug", "info", "warning", "error") else "error")
        if record.exc_info:
            method(message, logger=record.name, exc_info=record.exc_info)
        else:
            method(message, logger=record.name)


def route_library_logs(*names: str, level: str) -> None:
    """Send the stdlib loggers *names* (and their children) through structlog at *level*
    and above, instead of their own handlers and format (call after
    :func:`configure_logging`; give the library no logging config of its own)."""
    handler = _ToStructlog()
    for name in names:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(LOG_LEVELS[level])
        logger.propagate = False


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {_one_line(message)}", err=True)
    sys.exit(code)


def _package_version() -> str:
    """``asyncq.__version__``: the single source of the version (pyproject reads it too)."""
    from asyncq import __version__

    return __version__


class AsyncqGroup(click.Group):
    """A click group whose errors are one ``error: ...`` line on stderr, never a traceback."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        # Commands configure structlog for a terminal; put the caller's configuration
        # back afterwards so that in-process use (tests, embedding) is not affected.
        saved = structlog.get_config()
        try:
            self._main(args, prog_name, complete_var, **extra)
        finally:
            structlog.configure(**saved)

    def _main(
        self,
        args: Sequence[str] | None,
        prog_name: str | None,
        complete_var: str | None,
        **extra: Any,
    ) -> NoReturn:
        try:
            rv = super().main(args, prog_name or "asyncq", complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            sys.exit(0)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            _fail(exc.format_message() + hint, exc.exit_code)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except (click.Abort, KeyboardInterrupt):
            _fail("interrupted", 130)
        except AsyncqError as exc:
            _fail(str(exc))
        except (RedisConnectionError, RedisTimeoutError) as exc:
            _fail(f"cannot reach Redis: {exc}")
        except ResponseError as exc:
            _fail(f"Redis replied with an error: {exc}")
        except (ValueError, TypeError) as exc:
            if os.environ.get("ASYNCQ_DEBUG"):
                raise
            _fail(str(exc))
        except Exception as exc:
            if os.environ.get("ASYNCQ_DEBUG"):
                raise
            _fail(
                f"unexpected {exc.__class__.__name__}: {exc} "
                "(set ASYNCQ_DEBUG=1 to see the traceback)"
            )
        sys.exit(rv if isinstance(rv, int) else 0)


CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group("asyncq", cls=AsyncqGroup, context_settings=CONTEXT_SETTINGS)
@click.option(
    "--uri",
    "-u",
    metavar="URL",
    help=(
        f"Redis URL [default: ${ENV_URI}, then 'uri' in the config file, then {DEFAULT_URI}]. "
        "Also rediss://, redis-socket://, redis-sentinel://, redis-cluster://."
    ),
)
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    help=f"TOML config file with a 'uri' key [default: {DEFAULT_CONFIG} if it exists].",
)
@click.version_option(_package_version(), "--version", "-V", prog_name="asyncq")
@click.pass_context
def main(ctx: click.Context, uri: str | None, config_path: str | None) -> None:
    """Inspect and manage asyncq and Go asynq queues on Redis, and run workers.

    \b
    Examples:
      asyncq stats
      asyncq queue inspect default
      asyncq task ls --queue default --state archived
      asyncq task runall --queue default --state archived
      asyncq worker myapp.tasks:mux --concurrency 20 --queues critical=6,default=3
      asyncq dash
    """
    configure_logging("warning")
    ctx.obj = Settings(uri, config_path)
