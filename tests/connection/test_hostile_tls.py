"""A TLS certificate the client cannot verify (issue 25 item 13): not transient, so every
entry point fails at once with the verification reason instead of retrying."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncq import Client, EnqueueRetryError, Inspector, ServeMux, Server, Task
from asyncq._producer.failover import is_retryable
from tests.support.redis_server import RedisServer, free_port


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    args = ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *args],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def tls_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a self-signed certificate")
    cert, key = _self_signed(tmp_path_factory.mktemp("tls"))
    port = free_port()
    tls = ["--tls-key-file", str(key), "--tls-auth-clients", "no"]
    server = RedisServer(extra_args=["--tls-port", str(port), "--tls-cert-file", str(cert), *tls])
    try:
        server.start()
    except RuntimeError:
        pytest.skip("this redis-server was built without TLS")
    try:
        yield f"rediss://localhost:{port}/0"
    finally:
        server.cleanup()


async def test_an_enqueue_fails_at_once_with_the_verification_reason(tls_url: str) -> None:
    async with Client(tls_url) as client:
        with pytest.raises(Exception) as caught:
            await client.enqueue(Task("t", b"x"))
    assert not isinstance(caught.value, EnqueueRetryError), caught.value
    assert "certificate verify failed" in str(caught.value)
    assert not is_retryable(caught.value)


async def test_a_batch_and_the_inspector_fail_with_the_reason(tls_url: str) -> None:
    async with Client(tls_url) as client:
        with pytest.raises(Exception, match="certificate verify failed") as caught:
            await client.enqueue_many([Task("t", b"x")])
    assert not isinstance(caught.value, EnqueueRetryError)
    async with Inspector(tls_url) as insp:
        with pytest.raises(Exception, match="certificate verify failed"):
            await insp.queues()


async def test_a_server_refuses_to_start_with_the_reason(tls_url: str) -> None:
    server = Server(tls_url, concurrency=1)
    with pytest.raises(Exception, match="certificate verify failed"):
        await server.start(ServeMux())
    await server.shutdown()
