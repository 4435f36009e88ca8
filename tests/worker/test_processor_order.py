"""Queue order per fetch (spec 5.5), deadline computation (5.7) and the retry delay."""

from __future__ import annotations

import math
import random
from collections import Counter
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import _keys as keys
from asyncq._logging import error_text
from asyncq._producer.client import Client
from asyncq._worker.attempt import DEFAULT_TIMEOUT, compute_deadline
from asyncq._worker.policy import default_retry_delay
from asyncq._worker.processor import QueueOrder, normalize_queues
from asyncq._worker.server import Server
from asyncq.errors import RevokeTask, SkipRetry, wraps_error
from asyncq.mux import ServeMux
from asyncq.proto.asynq import TaskMessage
from asyncq.task import Task
from tests.support.procs import FAST, wait_until

queue_maps = st.dictionaries(
    st.text(alphabet="abcdefgh", min_size=1, max_size=4),
    st.integers(min_value=1, max_value=12),
    min_size=1,
    max_size=6,
)


@given(queues=queue_maps, strict=st.booleans(), seed=st.integers(0, 2**32))
def test_order_is_a_permutation_of_the_queues(
    queues: dict[str, int], strict: bool, seed: int
) -> None:
    order = QueueOrder(queues, strict=strict, rng=random.Random(seed))()
    assert sorted(order) == sorted(queues)


@given(queues=queue_maps)
def test_strict_order_is_by_priority_and_fixed(queues: dict[str, int]) -> None:
    qo = QueueOrder(queues, strict=True)
    order = qo()
    prios = [queues[q] for q in order]
    assert prios == sorted(prios, reverse=True)
    assert qo() == order


@given(queues=queue_maps)
def test_normalize_divides_by_gcd(queues: dict[str, int]) -> None:
    norm = normalize_queues(queues)
    assert math.gcd(*norm.values()) == 1
    g = math.gcd(*queues.values())
    assert all(norm[q] * g == p for q, p in queues.items())


def test_weighted_first_pick_is_proportional_to_priority() -> None:
    weights = {"critical": 6, "default": 3, "low": 1}
    qo = QueueOrder(weights, rng=random.Random(1234))
    n = 20_000
    first = Counter(qo()[0] for _ in range(n))
    total = sum(weights.values())
    for name, w in weights.items():
        p = w / total
        sigma = math.sqrt(n * p * (1 - p))
        # Five standard deviations: a false alarm is ~1 in 1.7 million runs.
        assert abs(first[name] - n * p) < 5 * sigma, (name, first)


def test_weighted_order_uses_gcd_normalised_weights() -> None:
    qo = QueueOrder({"a": 20, "b": 10}, rng=random.Random(7))
    first = Counter(qo()[0] for _ in range(6000))
    assert abs(first["a"] / 6000 - 2 / 3) < 0.05


def test_single_queue_is_always_itself() -> None:
    qo = QueueOrder({"only": 5})
    assert qo() == ["only"]


def test_empty_queue_map_is_rejected() -> None:
    with pytest.raises(ValueError):
        QueueOrder({})


# -- deadlines (spec 5.7) --------------------------------------------------------------


def test_deadline_defaults_to_30_minutes() -> None:
    assert compute_deadline(TaskMessage(), 1000.5) == 1000.5 + DEFAULT_TIMEOUT


@given(
    now=st.floats(min_value=1e9, max_value=2e9),
    timeout=st.integers(min_value=0, max_value=10**6),
    deadline_offset=st.integers(min_value=-(10**6), max_value=10**6),
    has_deadline=st.booleans(),
)
def test_deadline_is_the_earliest_of_timeout_and_deadline(
    now: float, timeout: int, deadline_offset: int, has_deadline: bool
) -> None:
    deadline = int(now) + deadline_offset if has_deadline else 0
    msg = TaskMessage(timeout=timeout, deadline=deadline)
    got = compute_deadline(msg, now)
    if timeout == 0 and deadline == 0:
        assert got == now + DEFAULT_TIMEOUT
    elif timeout == 0:
        assert got == deadline
    elif deadline == 0:
        assert got == now + timeout
    else:
        assert got == min(now + timeout, deadline)


@given(n=st.integers(min_value=0, max_value=25))
def test_default_retry_delay_is_asynqs_formula(n: int) -> None:
    delay = default_retry_delay(n, ValueError(), Task("t"))
    low = n**4 + 15
    assert timedelta(seconds=low) <= delay <= timedelta(seconds=low + 29 * (n + 1))


def test_wraps_error_follows_causes_and_groups() -> None:
    assert wraps_error(SkipRetry(), SkipRetry)
    try:
        try:
            raise SkipRetry()
        except SkipRetry as inner:
            raise ValueError("outer") from inner
    except ValueError as exc:
        assert wraps_error(exc, SkipRetry)
    group = ExceptionGroup("g", [ValueError("a"), RevokeTask()])
    assert wraps_error(group, RevokeTask)
    assert not wraps_error(ValueError("plain"), SkipRetry)


def test_error_text() -> None:
    assert error_text(ValueError("bad")) == "ValueError: bad"
    assert error_text(KeyError()) == "KeyError"
    assert error_text(SkipRetry()) == "skip retry for the task"


# -- against Redis ----------------------------------------------------------------------


def recording_mux(order: list[str]) -> ServeMux:
    mux = ServeMux()

    async def handle(task: Task) -> None:
        order.append(task.queue or "")

    mux.handle("t", handle)
    return mux


async def test_strict_priority_starves_lower_queues(redis: Redis, client: Client) -> None:
    for q in ("low", "default", "critical"):
        await client.enqueue_many([Task("t") for _ in range(15)], queue=q)
    order: list[str] = []
    server = Server(
        redis,
        concurrency=1,
        queues={"critical": 6, "default": 3, "low": 1},
        strict_priority=True,
        **FAST,
    )
    async with server:
        await server.start(recording_mux(order))
        await wait_until(lambda: len(order) == 45, what="45 tasks")
    assert order == ["critical"] * 15 + ["default"] * 15 + ["low"] * 15


async def test_weighted_priority_serves_every_queue_roughly_by_weight(
    redis: Redis, client: Client
) -> None:
    for q in ("low", "default", "critical"):
        await client.enqueue_many([Task("t") for _ in range(200)], queue=q)
    order: list[str] = []
    server = Server(redis, concurrency=1, queues={"critical": 6, "default": 3, "low": 1}, **FAST)
    async with server:
        await server.start(recording_mux(order))
        await wait_until(lambda: len(order) >= 200, what="200 tasks")
    first = Counter(order[:200])
    # Expected 120/60/20 while every queue still has work; 5-sigma binomial bounds.
    for name, p in (("critical", 0.6), ("default", 0.3), ("low", 0.1)):
        sigma = math.sqrt(200 * p * (1 - p))
        assert abs(first[name] - 200 * p) < 5 * sigma, first


async def test_paused_queue_is_skipped(redis: Redis, client: Client) -> None:
    await client.enqueue_many([Task("t") for _ in range(3)], queue="paused")
    order: list[str] = []
    await redis.set(keys.paused_key("paused"), 1)
    server = Server(redis, concurrency=2, queues={"paused": 5, "open": 1}, **FAST)
    async with server:
        await server.start(recording_mux(order))
        await client.enqueue_many([Task("t") for _ in range(3)], queue="open")
        await wait_until(lambda: len(order) == 3, what="open queue processed")
        await wait_until(lambda: server.stats.empty_fetches >= 3, what="more empty fetches")
        assert order == ["open"] * 3
        assert await redis.llen(keys.pending_key("paused")) == 3
        await redis.delete(keys.paused_key("paused"))
        await wait_until(lambda: len(order) == 6, what="resumed queue processed")
    assert order[3:] == ["paused"] * 3
