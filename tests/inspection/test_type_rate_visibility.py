"""Type rate limits seen from outside: Inspector, server records, refusal counter."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from click.testing import CliRunner, Result
from redis.asyncio import Redis

from asyncq import Client, Inspector, Limits, ServeMux, Server, Task, TypeRateInfo
from asyncq import _keys as keys
from asyncq._broker import Broker
from asyncq._broker.typerate import take_type_tokens
from asyncq.cli import main
from asyncq.proto.asynq import ServerInfo as ServerInfoProto
from tests.support.procs import FAST, wait_until


async def test_bucket_counts_refused_tokens_and_tells_the_next_one(redis: Redis) -> None:
    broker = Broker(redis)
    iv = 1_000_000  # 1/s, burst 2: the calls below take far less than an interval
    await take_type_tokens(broker, "t", 5, interval_us=iv, burst=2, max_wait_us=0)
    await take_type_tokens(broker, "t", 2, interval_us=iv, burst=2, max_wait_us=0)
    async with Inspector(redis) as insp:
        info = await insp.type_rate("t")
    assert info is not None
    assert (info.rate, info.per_second, info.tokens) == ("2/2s", 1.0, 0)
    assert info.limited == 5  # 3 of the first call, 2 of the second
    assert info.next_token is not None
    assert timedelta(0) < info.next_token <= timedelta(microseconds=iv)
    assert info.servers == {}  # no live server configures it
    ttl = await redis.pttl(keys.type_rate_key("t"))
    # tat is two intervals ahead (burst 2 taken): an hour past that.
    assert 3_600_000 < ttl <= 3_600_000 + 2_000


async def test_refusal_alone_never_leaves_a_bucket_without_expiry(redis: Redis) -> None:
    broker = Broker(redis)
    # burst 1 with a huge interval: the first token is taken, every later one refused.
    for _ in range(3):
        await take_type_tokens(broker, "u", 2, interval_us=10**9, burst=1, max_wait_us=0)
    assert int(await redis.hget(keys.type_rate_key("u"), "limited") or 0) == 5
    assert await redis.pttl(keys.type_rate_key("u")) > 0


async def test_servers_publish_their_type_rates_and_the_inspector_lists_them(
    redis: Redis,
) -> None:
    ran: list[str] = []
    mux = ServeMux()

    @mux.handler("slowtype")
    async def slow(task: Task) -> None:
        ran.append(task.type)

    rates = {"slowtype": "1/s", "idle:type": "600/min"}
    server = Server(redis, concurrency=4, limits=Limits(type_rate_limits=rates), **FAST)
    async with Inspector(redis) as insp, Client(redis) as client:
        async with server:
            await server.start(mux)

            async def listed() -> bool:
                return len(await insp.type_rates()) == 2

            await wait_until(listed, within=10, what="the server's type rates")
            idle, _ = await insp.type_rates()
            # No task of the type ran: no bucket, the configured rate.
            assert idle == TypeRateInfo("idle:type", "600/min", 10.0, None, None, 0, {"600/min": 1})
            (srv,) = await insp.servers()
            assert srv.type_rate_limits == rates
            await client.enqueue_many([Task("slowtype", b"", max_retry=0) for _ in range(6)])
            await wait_until(lambda: len(ran) == 6, within=60, what="every task")
            rescheduled = server.stats.type_rate_limited
            slow_info = await insp.type_rate("slowtype")
        assert slow_info is not None
        assert slow_info.rate == "1/s" and slow_info.servers == {"1/s": 1}
        assert slow_info.tokens is not None and 0 <= slow_info.tokens <= 1
        # Every refusal the script counted is a task this server put back.
        assert rescheduled > 0 and slow_info.limited == rescheduled
        # Stopped: its record is gone at once; the bucket stays readable by name.
        assert await insp.type_rates() == []
        assert (await insp.type_rate("idle:type")) is None
        assert (await insp.type_rate("slowtype")) is not None


async def test_servers_that_disagree_are_shown_by_rate(redis: Redis) -> None:
    broker = Broker(redis)
    for sid, rate in (("a", "5/s"), ("b", "5/s"), ("c", "1/min")):
        info = ServerInfoProto(host="h", pid=1, server_id=sid, concurrency=1)
        await broker.write_server_state(info, [], 10, type_rates={"api": rate})
    go = ServerInfoProto(host="h", pid=2, server_id="go", concurrency=1)
    await broker.write_server_state(go, [], 10)  # a Go-like server: no record
    assert await redis.exists(keys.server_type_rates_key("h", 2, "go")) == 0
    async with Inspector(redis) as insp:
        (api,) = await insp.type_rates()
        assert api.servers == {"1/min": 1, "5/s": 2}
        assert api.rate == "1/min" and api.tokens is None  # no bucket yet
        assert {s.id: s.type_rate_limits for s in await insp.servers()} == {
            "a": {"api": "5/s"},
            "b": {"api": "5/s"},
            "c": {"api": "1/min"},
            "go": {},
        }
    ttl = await redis.ttl(keys.server_type_rates_key("h", 1, "a"))
    assert 0 < ttl <= 10
    await broker.clear_server_state("h", 1, "a")
    assert await redis.exists(keys.server_type_rates_key("h", 1, "a")) == 0


async def test_type_rate_refuses_bad_names(redis: Redis) -> None:
    async with Inspector(redis) as insp:
        with pytest.raises(ValueError, match="non-empty"):
            await insp.type_rate("")
        with pytest.raises(ValueError, match="holds"):
            await insp.type_rate("a}b")


async def _cli(redis_url: str, *args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "80", "ASYNCQ_REDIS_URL": None})
    return await asyncio.to_thread(runner.invoke, main, ["-u", redis_url, *args])


async def test_cli_typerate_ls_and_inspect(redis: Redis, redis_url: str) -> None:
    res = await _cli(redis_url, "typerate", "ls")
    assert res.exit_code == 0 and "No task type rate limits" in res.output
    await _seed_fleet(redis)

    res = await _cli(redis_url, "typerate", "ls")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["Type", "Rate", "Tokens", "Put", "back", "Servers"]
    partner = next(line for line in lines if line.startswith("api:partner"))
    assert "1/min" in partner and "0 (next in" in partner and " 2 " in partner
    assert "1 at 1/min, 1 at 2/min" in partner
    mail = next(line for line in lines if line.startswith("mail"))
    assert mail.split()[:4] == ["mail", "100/s", "-", "0"] and "2 at 100/s" in mail
    assert "disagree on the rate of 'api:partner': 1/min, 2/min" in res.stderr
    assert all(len(line) <= 80 for line in lines)

    res = await _cli(redis_url, "typerate", "ls", "--json")
    rows = json.loads(res.stdout)
    assert [r["task_type"] for r in rows] == ["api:partner", "mail"]
    assert rows[0]["limited"] == 2 and rows[0]["tokens"] == 0 and rows[0]["per_second"] == 1 / 60
    assert 0 < rows[0]["next_token"] <= 60
    assert rows[1]["servers"] == {"100/s": 2} and rows[1]["tokens"] is None

    res = await _cli(redis_url, "typerate", "inspect", "mail", "nosuch", "api:partner")
    assert res.exit_code == 1
    assert "Task type: mail" in res.stdout and "Task type: api:partner" in res.stdout
    assert "Put back by the rate: 2" in res.stdout
    assert "error: task type 'nosuch' has no rate limit" in res.stderr

    res = await _cli(redis_url, "server", "ls")
    assert "h:1 type rates: api:partner 1/min, mail 100/s" in res.stdout
    assert "h:1 type rates: api:partner 2/min, mail 100/s" in res.stdout
    data = json.loads((await _cli(redis_url, "server", "ls", "--json")).stdout)
    assert sorted(s["type_rate_limits"]["api:partner"] for s in data) == ["1/min", "2/min"]

    res = await _cli(redis_url, "typerate", "inspect", "mail", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)[0]["rate"] == "100/s"
    res = await _cli(redis_url, "typerate", "inspect", "a{b}")
    assert res.exit_code == 1 and "holds" in res.stderr


async def _seed_fleet(redis: Redis) -> None:
    """Two servers that disagree on api:partner; its bucket refused two tasks."""
    broker = Broker(redis)
    for sid, rate in (("a", "1/min"), ("b", "2/min")):
        info = ServerInfoProto(host="h", pid=1, server_id=sid, concurrency=1)
        await broker.write_server_state(
            info, [], 30, type_rates={"api:partner": rate, "mail": "100/s"}
        )
    await take_type_tokens(broker, "api:partner", 3, interval_us=60_000_000, burst=1, max_wait_us=0)


async def test_metrics_show_type_and_queue_rates(redis: Redis) -> None:
    from asyncq.metrics import collect_queue_metrics, render

    await _seed_fleet(redis)
    async with Client(redis) as client:
        await client.enqueue(Task("x", b"", queue="paced"))
        await client.enqueue(Task("x", b"", queue="plain"))
    # A queue bucket as workers with rate_limits={"paced": "50/s"} write it.
    await redis.hset(keys.rate_key("paced"), mapping={"tat": 0, "interval": 20_000, "burst": 50})
    async with Inspector(redis) as insp:
        await insp.set_ordered("plain", True)
        text = render(await collect_queue_metrics(insp)).decode()
    assert 'asyncq_type_rate_limit_per_second{task_type="api:partner"} 0.0166' in text
    assert 'asyncq_type_rate_limit_per_second{task_type="mail"} 100.0' in text
    assert 'asyncq_type_rate_tokens{task_type="api:partner"} 0.0' in text
    assert 'asyncq_type_rate_limited_total{task_type="api:partner"} 2.0' in text
    assert 'asyncq_type_rate_tokens{task_type="mail"}' not in text  # no bucket yet
    assert 'asyncq_type_rate_servers{rate="1/min",task_type="api:partner"} 1.0' in text
    assert 'asyncq_type_rate_servers{rate="100/s",task_type="mail"} 2.0' in text
    assert 'asyncq_queue_rate_limit_per_second{queue="paced"} 50.0' in text
    assert 'asyncq_queue_rate_tokens{queue="paced"} 50.0' in text
    assert 'asyncq_queue_rate_limit_per_second{queue="plain"}' not in text
    assert 'asyncq_queue_ordered{queue="plain"} 1.0' in text
    assert 'asyncq_queue_ordered{queue="paced"} 0.0' in text
