"""``asyncq web`` (the web UI) and ``asyncq metrics`` (a standalone Prometheus exporter)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import click

from asyncq._redis.options import redact_uri as redact
from asyncq.cli._app import CliError, Settings, settings
from asyncq.cli._listen import bound_port, listen

__all__ = ["metrics", "register", "web"]


def _uri(ctx: click.Context, flag: str | None) -> str:
    opts = settings(ctx)
    if flag is not None:
        opts = Settings(flag, opts.config_path)
    return opts.uri()


def _need(extra: str, module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise CliError(
            f"this command needs the {extra!r} extra: pip install 'asyncq[{extra}]'"
        ) from None


@click.command("web")
@click.option(
    "--uri",
    "-u",
    "uri_flag",
    metavar="URL",
    help="Redis URL (same as 'asyncq --uri URL ...').",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--read-only", is_flag=True, help="Hide and refuse every change (405).")
@click.option("--username", envvar="ASYNCQ_WEB_USERNAME", help="Require HTTP basic auth.")
@click.option(
    "--password",
    envvar="ASYNCQ_WEB_PASSWORD",
    help="Basic-auth password [env ASYNCQ_WEB_PASSWORD; prefer it to the flag].",
)
@click.option(
    "--token",
    envvar="ASYNCQ_WEB_TOKEN",
    help="Require 'Authorization: Bearer TOKEN' [env ASYNCQ_WEB_TOKEN].",
)
@click.option(
    "--poll",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Default page refresh period in seconds.",
)
@click.option("--root-path", default="", help="URL prefix when served behind a proxy path.")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="Host header values to accept (repeatable) [default: localhost names when "
    "listening on a loopback address, else any].",
)
@click.pass_context
def web(
    ctx: click.Context,
    *,
    host: str,
    port: int,
    read_only: bool,
    username: str | None,
    password: str | None,
    token: str | None,
    poll: float,
    root_path: str,
    allowed_hosts: tuple[str, ...],
    uri_flag: str | None,
) -> None:
    """Web UI, JSON API (/api/) and Prometheus /metrics over HTTP.

    \b
    Examples:
      asyncq web
      asyncq --uri redis://redis:6379/0 web --read-only
      ASYNCQ_WEB_TOKEN=s3cret asyncq web --host 0.0.0.0 --port 8080
    """
    _need("web", "starlette")
    _need("web", "uvicorn")
    import uvicorn

    from asyncq._http import LoopbackHosts, is_loopback
    from asyncq.web import create_app

    uri = _uri(ctx, uri_flag)
    try:
        app = create_app(
            uri,
            read_only=read_only,
            username=username,
            password=password,
            token=token,
            poll_interval=timedelta(seconds=poll),
            allowed_hosts=list(allowed_hosts) or None,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not allowed_hosts and is_loopback(host):
        # A page on another site that rebinds its DNS name to a loopback address must not
        # reach us: only this server's loopback names pass, the gateway's rule.
        app.add_middleware(LoopbackHosts)
    if not is_loopback(host) and not (password or token):
        click.echo(
            f"warning: listening on {host} without --password or --token: anyone who can reach "
            "this port can change your queues (add --read-only or auth)",
            err=True,
        )
    sock = listen(host, port)
    click.echo(
        f"asyncq web on http://{host}:{bound_port(sock)}{root_path}/ (Redis {redact(uri)})"
        + (" read-only" if read_only else ""),
        err=True,
    )
    config = uvicorn.Config(app, root_path=root_path, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


@click.group("metrics", invoke_without_command=True)
@click.option(
    "--uri",
    "-u",
    "uri_flag",
    metavar="URL",
    help="Redis URL (same as 'asyncq --uri URL ...').",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9876, show_default=True, type=click.IntRange(0, 65535))
@click.pass_context
def metrics(ctx: click.Context, *, host: str, port: int, uri_flag: str | None) -> None:
    """Prometheus exporter of asynq x/metrics queue metrics (/metrics); with a
    subcommand (asyncq metrics top), the metrics history the workers keep in Redis.

    The metric names and labels are asynq's, so asynq Grafana dashboards work.
    """
    if ctx.invoked_subcommand is not None:
        if uri_flag is not None:  # the subcommand reads the Redis named here
            ctx.obj = Settings(uri_flag, settings(ctx).config_path)
        return
    _need("metrics", "prometheus_client")
    from asyncq import Inspector
    from asyncq.metrics import MetricsExporter

    uri = _uri(ctx, uri_flag)

    async def serve() -> None:
        async with Inspector(uri) as inspector:
            exporter = MetricsExporter(inspector, host=host, port=port)
            try:
                bound = await exporter.start()
            except OSError as exc:
                raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
            click.echo(
                f"asyncq metrics on http://{host}:{bound}/metrics (Redis {redact(uri)})", err=True
            )
            try:
                await exporter.serve_forever()
            finally:
                await exporter.aclose()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


def register(main: click.Group) -> None:
    """Add ``web`` and ``metrics`` to the ``asyncq`` group."""
    main.add_command(web)
    main.add_command(metrics)
