"""The one outcome decision of the processor and the recoverer (asyncq._worker.outcome)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from asyncq._broker.workflow import WORKFLOW_HEADER, WORKFLOW_QUEUE_HEADER, WORKFLOW_STEP_HEADER
from asyncq._logging import error_text
from asyncq._worker.outcome import decide, not_run
from asyncq._worker.server import Server
from asyncq.errors import LeaseExpiredError, RateLimited, RevokeTask, SkipRetry
from asyncq.proto.asynq import TaskMessage

NOW = 1_700_000_000.0
LOG = structlog.get_logger("test")


def config(**options: Any) -> Any:
    return Server("redis://127.0.0.1:9/0", **options).config


CFG = config(retry_delay=lambda n, e, t: timedelta(seconds=10 * (n + 1)))


def msg(**fields: Any) -> TaskMessage:
    return TaskMessage(**{"id": "x", "type": "t", "queue": "q", "retry": 3, **fields})


def step(**fields: Any) -> TaskMessage:
    headers = {WORKFLOW_HEADER: "wf", WORKFLOW_QUEUE_HEADER: "q", WORKFLOW_STEP_HEADER: "0.0"}
    return msg(headers=headers, **fields)


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(NOW + seconds, UTC)


@pytest.mark.parametrize(
    ("m", "exc", "expected"),
    [
        (msg(), None, ("done", None, True, False)),
        (msg(retention=60), None, ("complete", None, True, False)),
        (step(), None, ("done", None, True, True)),
        (msg(), ValueError("x"), ("retry", at(10), True, False)),
        (msg(retried=2), ValueError("x"), ("retry", at(30), True, False)),
        (msg(retried=3), ValueError("x"), ("archive", None, True, False)),
        (step(retried=3), ValueError("x"), ("archive", None, True, True)),
        (step(), ValueError("x"), ("retry", at(10), True, False)),
        (msg(), SkipRetry("no"), ("archive", None, True, False)),
        (msg(), RevokeTask("gone"), ("revoke", None, True, False)),
        (msg(retried=3), RateLimited(timedelta(seconds=5)), ("retry", at(5), False, False)),
    ],
)
def test_decide(m: TaskMessage, exc: BaseException | None, expected: tuple[Any, ...]) -> None:
    out = decide(m, exc, lease="held", config=CFG, now=NOW, log=LOG)
    assert (out.kind, out.retry_at, out.is_failure, out.workflow) == expected
    assert out.err_msg == ("" if exc is None else error_text(exc))


def test_a_wrapped_revoke_or_skip_retry_counts_like_go_errors_is() -> None:
    try:
        raise ValueError("outer") from RevokeTask("inner")
    except ValueError as exc:
        assert decide(msg(), exc, lease="held", config=CFG, now=NOW, log=LOG).kind == "revoke"
    group = ExceptionGroup("g", [ValueError("a"), SkipRetry("b")])
    assert decide(msg(), group, lease="held", config=CFG, now=NOW, log=LOG).kind == "archive"


@given(
    retried=st.integers(0, 30),
    retry=st.integers(0, 30),
    failed=st.booleans(),
    retention=st.integers(0, 100),
)
def test_an_expired_lease_writes_nothing_whatever_happened(
    retried: int, retry: int, failed: bool, retention: int
) -> None:
    m = msg(retried=retried, retry=retry, retention=retention)
    exc = ValueError("x") if failed else None
    assert decide(m, exc, lease="expired", config=CFG, now=NOW, log=LOG).kind == "lost"


@given(retried=st.integers(0, 30), retry=st.integers(0, 30))
def test_the_recoverer_retries_at_once_by_default_until_the_retries_are_used(
    retried: int, retry: int
) -> None:
    default = config()
    out = decide(
        msg(retried=retried, retry=retry), LeaseExpiredError(), lease="recovering",
        config=default, now=NOW, log=LOG,
    )  # fmt: skip
    if retried >= retry:
        assert out.kind == "archive"
    else:
        assert (out.kind, out.retry_at, out.is_failure) == ("retry", at(0), True)
    assert out.err_msg == "asynq: task lease expired"


def test_a_misbehaving_retry_delay_falls_back_to_asynqs_formula() -> None:
    def broken(n: int, e: BaseException, t: Any) -> timedelta:
        raise RuntimeError("bug")

    out = decide(msg(), ValueError("x"), lease="held", config=config(retry_delay=broken),
                 now=NOW, log=LOG)  # fmt: skip
    assert out.kind == "retry" and out.retry_at is not None
    assert at(15) <= out.retry_at <= at(15 + 29)


def test_not_run_uses_no_retry() -> None:
    out = not_run(NOW, timedelta(seconds=3), "no token")
    assert (out.kind, out.retry_at, out.is_failure, out.err_msg) == (
        "retry",
        at(3),
        False,
        "no token",
    )
