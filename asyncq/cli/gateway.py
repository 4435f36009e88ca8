"""``asyncq gateway``: serve the HTTP enqueue gateway with uvicorn."""

from __future__ import annotations

import ipaddress
import os

import click

from asyncq._redis.options import redact_uri
from asyncq.cli._app import LOG_LEVELS, CliError, configure_logging, route_library_logs, settings
from asyncq.cli._listen import bound_port, listen

__all__ = ["ENV_TOKEN", "gateway", "require_extra"]

ENV_TOKEN = "ASYNCQ_GATEWAY_TOKEN"
EXTRA_HINT = "pip install 'asyncq[gateway]'"


def require_extra(what: str) -> None:
    """Raise CliError naming the extra when the gateway's libraries are missing."""
    missing = []
    for module in ("starlette", "uvicorn", "httpx", "pydantic"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise CliError(f"{what} needs {', '.join(missing)}: {EXTRA_HINT}")


def _is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command(short_help="Serve the HTTP enqueue gateway (any language can enqueue).")
@click.option("--uri", "-u", "gateway_uri", metavar="URL", help="Redis URL (overrides the global).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
# 8081: `asyncq web` has 8080, and both often run on one machine.
@click.option("--port", "-p", type=click.IntRange(0, 65535), default=8081, show_default=True)
@click.option(
    "--token",
    envvar=ENV_TOKEN,
    metavar="TOKEN",
    help=f"Bearer token clients must send [env: {ENV_TOKEN}]; required off localhost.",
)
@click.option(
    "--max-body",
    type=click.IntRange(min=1),
    default=None,
    metavar="BYTES",
    help="Largest request body accepted [default: 8 MiB].",
)
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Most tasks in one batch request [default: 1000].",
)
@click.option(
    "--log-level",
    type=click.Choice(list(LOG_LEVELS), case_sensitive=False),
    default="info",
    show_default=True,
    help="Least severe log level written to stderr.",
)
@click.pass_context
def gateway(
    ctx: click.Context,
    *,
    gateway_uri: str | None,
    host: str,
    port: int,
    token: str | None,
    max_body: int | None,
    max_batch: int | None,
    log_level: str,
) -> None:
    """Serve POST /api/queues/{queue}/tasks and friends for producers in any language.

    The OpenAPI description is at /api/openapi.json. Without --token only
    clients on this machine are served, and binding to a non-loopback
    address is refused.

    \b
    Example:
      asyncq gateway --port 8081
      curl -H 'Content-Type: application/json' \\
           -d '{"type":"email:send","payload":{"to":"a@example.com"}}' \\
           http://127.0.0.1:8081/api/queues/default/tasks
    """
    require_extra("asyncq gateway")
    import uvicorn

    from asyncq.gateway import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY_BYTES, create_app

    if token is not None and not token.strip():
        raise CliError(f"the gateway token is empty (check --token / ${ENV_TOKEN})")
    if token is None and not _is_local(host):
        raise CliError(
            f"refusing to serve {host} without a token: give --token or set ${ENV_TOKEN} "
            "(only 127.0.0.1/localhost may go without one)"
        )
    if gateway_uri is not None:
        settings(ctx).uri_flag = gateway_uri
    uri = settings(ctx).uri()
    level = log_level.lower()
    configure_logging(level)
    app = create_app(
        uri,
        token=token,
        max_body_bytes=max_body or DEFAULT_MAX_BODY_BYTES,
        max_batch=max_batch or DEFAULT_MAX_BATCH,
    )
    sock = listen(host, port)
    click.echo(
        f"asyncq gateway on http://{host}:{bound_port(sock)} for {redact_uri(uri)} "
        f"(OpenAPI: /api/openapi.json, token {'required' if token else 'off: local only'})",
        err=True,
    )
    # uvicorn's own lines ("Started server process", ...) in asyncq's log format: no
    # logging config of uvicorn's, its loggers handed to structlog.
    route_library_logs("uvicorn", level=level)
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level=level,
        access_log=level == "debug",
        server_header=False,
        proxy_headers=False,
        lifespan="on",
    )
    os.environ.pop(ENV_TOKEN, None)  # not inherited by anything this process starts
    uvicorn.Server(config).run(sockets=[sock])
