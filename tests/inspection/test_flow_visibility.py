"""Limits, rates and ordered flags given to servers by code or flag show wherever queues show:
the Inspector, `asyncq queue inspect`, the web UI and API, and the metrics, with how many live
servers configure each value."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from click.testing import CliRunner
from redis.asyncio import Redis

from asyncq import Client, Inspector, Limits, ServeMux, Server, Task
from asyncq.cli import main
from asyncq.metrics._queues import collect_queue_metrics, render
from asyncq.web import create_app
from tests.support.procs import FAST, wait_until

QUEUES = {"partner": 1, "ledger": 1, "tenant:*": 1}


def _server(redis_url: str, limit: int) -> Server:
    return Server(
        redis_url,
        queues=QUEUES,
        limits=Limits(
            queue_concurrency={"partner": limit, "tenant:*": 3},
            local_queue_concurrency={"partner": 1},
            rate_limits={"partner": "10/s burst 1"},
            ordered_queues=["ledger"],
        ),
        **FAST,
    )


@pytest.fixture
async def http(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    web = create_app(redis_url)
    async with (
        web.router.lifespan_context(web),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=web), base_url="http://t") as h,
    ):
        yield h


async def test_configured_flow_control_shows_everywhere(
    redis_url: str, redis: Redis, http: httpx.AsyncClient
) -> None:
    async with Client(redis) as client:
        for queue in ("partner", "ledger", "tenant:7"):  # later tasks: the queues exist
            await client.enqueue(Task("t", b""), queue=queue, process_in=timedelta(hours=1))
    before = await Inspector(redis).queue_info("partner")
    assert (before.concurrency_limit, before.rate_limit, before.configured_by) == (None, None, {})
    first, second = _server(redis_url, 2), _server(redis_url, 4)
    async with first, second:
        await first.start(ServeMux())
        await second.start(ServeMux())
        insp = Inspector(redis)

        async def both_published() -> bool:
            info = await insp.queue_info("partner")
            return sum(info.configured_by.get("limit", {}).values()) == 2

        await wait_until(both_published, within=20, what="both servers' flow records")
        info = await insp.queue_info("partner")
        assert info.configured_by == {
            "limit": {"2": 1, "4": 1},
            "local": {"1": 2},
            "rate": {"10/s burst 1": 2},
        }
        assert info.concurrency_limit == 2  # no stored limit: the smallest configured
        assert (info.rate_limit, info.rate_tokens) == ("10/s burst 1", None)  # no bucket yet
        assert info.configured_text == (
            "limit 2 (1 server), limit 4 (1 server), local limit 1 (2 servers), "
            "rate 10/s burst 1 (2 servers)"
        )
        ledger = await insp.queue_info("ledger")
        assert ledger.ordered and ledger.configured_by == {"ordered": {"yes": 2}}
        tenant = await insp.queue_info("tenant:7")  # through the pattern
        assert (tenant.concurrency_limit, tenant.configured_by) == (3, {"limit": {"3": 2}})
        servers = {s.id: s for s in await insp.servers()}
        assert servers[first.server_id].queue_concurrency == {"partner": 2, "tenant:*": 3}
        assert servers[first.server_id].local_queue_concurrency == {"partner": 1}
        assert servers[second.server_id].rate_limits == {"partner": "10/s burst 1"}
        assert servers[second.server_id].ordered_queues == ["ledger"]

        res = await asyncio.to_thread(
            CliRunner().invoke, main, ["-u", redis_url, "queue", "inspect", "partner"]
        )
        assert "Limit: 2 running fleet-wide" in res.output, res.output
        assert "Rate limit: 10/s burst 1    Tokens now: -" in res.output
        assert f"Configured by live servers: {info.configured_text}" in res.output

        res = await asyncio.to_thread(CliRunner().invoke, main, ["-u", redis_url, "server", "ls"])
        assert (
            "queue flow control: limit partner=2, limit tenant:*=3, local limit partner=1, "
            "rate partner=10/s burst 1, ordered ledger"
        ) in res.output, res.output
        servers_page = (await http.get("/servers")).text
        assert "limit partner=4;" in servers_page and "ordered ledger;" in servers_page
        api = (await http.get("/api/queues/partner")).json()["queue"]
        assert api["concurrency_limit"] == 2
        assert api["configured_by"] == info.configured_by
        page = (await http.get("/queues/partner")).text
        assert "Configured by live servers" in page and "rate 10/s burst 1 (2 servers)" in page

        text = render(await collect_queue_metrics(Inspector(redis))).decode()
        for labels, n in (
            ('queue="partner",setting="limit",value="2"', 1.0),
            ('queue="partner",setting="limit",value="4"', 1.0),
            ('queue="partner",setting="rate",value="10/s burst 1"', 2.0),
            ('queue="ledger",setting="ordered",value="yes"', 2.0),
        ):
            assert f"asyncq_queue_flow_servers{{{labels}}} {n}" in text, text
        assert 'asyncq_queue_concurrency_limit{queue="partner"} 2.0' in text
    # Gone with the servers.
    after = await Inspector(redis).queue_info("partner")
    assert after.configured_by == {} and after.concurrency_limit is None
