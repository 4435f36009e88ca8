"""The progress tests' worker: a Server of the test module's ``app`` fixture, with the
test timings (tests/support/procs.py's FAST)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from asyncq import Server
from tests.support.procs import FAST


@pytest.fixture
async def worker(app: Any) -> AsyncIterator[Server]:
    """A started Server serving the module's ``app``; shut down after the test."""
    server = app.server(**FAST)
    await server.start(app.mux)
    try:
        yield server
    finally:
        await server.shutdown()
