"""A web app that enqueues from its request handler, with the worker embedded in its lifespan.

No web framework needed: a tiny HTTP server on asyncio streams stands in for
one, with the same shape as a Starlette/FastAPI app::

    @asynccontextmanager
    async def lifespan(app):
        async with Client(REDIS_URL) as client, Server(REDIS_URL) as server:
            await server.start(mux)           # embedded worker (optional)
            app.state.client = client
            yield                             # shutdown(): stop, wait, requeue

    @app.post("/signup")
    async def signup(email: str, request: Request):
        info = await request.app.state.client.enqueue(Task.from_json("webapp:welcome_email", {...}))
        return {"task_id": info.id}

Run it and post to it::

    python examples/webapp.py                         # serves http://127.0.0.1:8000
    curl -X POST 'http://127.0.0.1:8000/signup?email=ada@example.com'

``python examples/webapp.py --self-test`` starts the app, sends one request to
itself, waits for the embedded worker to send the email and exits 0.
``ASYNCQ_REDIS_URL`` overrides the Redis address (default redis://127.0.0.1:6379/0),
``PORT`` the HTTP port (8000; 0 picks a free one). SIGTERM (``docker stop``) and Ctrl-C shut down
gracefully: running tasks finish, or go back to their queue after 8 s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncq import Client, ServeMux, Server, Task

QUEUE = "webapp"
REDIS_URL = os.environ.get("ASYNCQ_REDIS_URL", "redis://127.0.0.1:6379/0")
HOST, PORT = "127.0.0.1", int(os.environ.get("PORT", "8000"))

mux = ServeMux()
sent: asyncio.Queue[str] = asyncio.Queue()


@mux.handler("webapp:welcome_email")
async def send_welcome(task: Task) -> None:
    email = task.json()["email"]
    print(f"worker: welcome email sent to {email}")
    await sent.put(email)


@dataclass
class App:
    """What the lifespan provides to request handlers."""

    client: Client | None = None
    extra: dict[str, object] = field(default_factory=dict)


@asynccontextmanager
async def lifespan(app: App) -> AsyncIterator[None]:
    """Open the client and the embedded worker for the app's lifetime."""
    # Its own queue: a Quickstart worker on the same Redis (serving "default") leaves it alone.
    server = Server(REDIS_URL, concurrency=4, queues={QUEUE: 1})
    async with Client(REDIS_URL) as client, server:
        await client.ping()
        await server.start(mux)
        app.client = client
        try:
            yield
        finally:
            app.client = None
    # Leaving the block shut the server down (running tasks finish or are requeued).


async def signup(app: App, query: dict[str, list[str]]) -> tuple[int, dict[str, object]]:
    """POST /signup?email=...: enqueue the welcome email and answer at once."""
    emails = query.get("email") or []
    if len(emails) != 1 or "@" not in emails[0]:
        return 400, {"error": "give exactly one email=... query parameter"}
    assert app.client is not None
    info = await app.client.enqueue(
        Task.from_json("webapp:welcome_email", {"email": emails[0]}), queue=QUEUE
    )
    return 202, {"task_id": info.id, "queue": info.queue, "state": info.state.value}


async def handle_connection(
    app: App, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        request_line = (await reader.readline()).decode("latin-1").strip()
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass  # headers are not needed here
        method, target, _ = [*request_line.split(" ", 2), "", ""][:3]
        url = urlsplit(target)
        if method == "POST" and url.path == "/signup":
            status, body = await signup(app, parse_qs(url.query))
        else:
            status, body = 404, {"error": f"no route for {method} {url.path}"}
        payload = json.dumps(body).encode()
        reason = {202: "Accepted", 400: "Bad Request", 404: "Not Found"}[status]
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
    finally:
        writer.close()


async def post(path: str, port: int) -> str:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
    await writer.drain()
    response = (await reader.read()).decode()
    writer.close()
    return response.split("\r\n\r\n", 1)[1]


async def main(self_test: bool) -> int:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    app = App()
    # `docker stop`, systemd and Kubernetes send SIGTERM; Ctrl-C sends SIGINT. Both
    # end the serve loop below, so the lifespan's graceful shutdown runs.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Take the HTTP port first, so that a port in use is reported as such.
    try:
        http = await asyncio.start_server(
            lambda r, w: handle_connection(app, r, w), HOST, PORT, start_serving=False
        )
    except OSError as exc:
        print(
            f"error: cannot listen on http://{HOST}:{PORT}: {exc.strerror or exc} "
            "(set PORT to use another port)",
            file=sys.stderr,
        )
        return 1
    try:
        async with lifespan(app):
            await http.start_serving()
            port = http.sockets[0].getsockname()[1]
            print(f"listening on http://{HOST}:{port}  (POST /signup?email=...)", flush=True)
            if not self_test:
                await stop.wait()
                print("shutting down: running tasks finish or go back to their queue")
                http.close()
                return 0
            print("client:", await post("/signup?email=ada@example.com", port))
            email = await asyncio.wait_for(sent.get(), 30)
            assert email == "ada@example.com"
    except (RedisConnectionError, ConnectionRefusedError) as exc:
        print(f"error: cannot connect to Redis at {REDIS_URL}: {exc}", file=sys.stderr)
        return 1
    except RedisTimeoutError as exc:
        print(f"error: Redis at {REDIS_URL} did not answer in time: {exc}", file=sys.stderr)
        return 1
    except RedisError as exc:
        print(f"error: Redis at {REDIS_URL} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        http.close()
        await http.wait_closed()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main("--self-test" in sys.argv[1:])))
