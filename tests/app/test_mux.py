"""ServeMux: asynq's matching rules, middleware order, not-found, sync handlers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncq.errors import HandlerNotFoundError
from asyncq.mux import Handler, ServeMux
from asyncq.task import Task


def _recorder(name: str, calls: list[str]) -> Handler:
    async def handle(task: Task) -> None:
        calls.append(name)

    return handle


async def test_exact_match_wins_over_prefix() -> None:
    calls: list[str] = []
    mux = ServeMux()
    mux.handle("email", _recorder("prefix", calls))
    mux.handle("email:welcome", _recorder("exact", calls))
    await mux(Task("email:welcome"))
    await mux(Task("email:reminder"))
    assert calls == ["exact", "prefix"]


async def test_longest_prefix_wins_and_is_not_segment_aware() -> None:
    calls: list[str] = []
    mux = ServeMux()
    mux.handle("im", _recorder("im", calls))
    mux.handle("image:", _recorder("image:", calls))
    mux.handle("image:resize", _recorder("image:resize", calls))
    await mux(Task("image:resize:large"))  # longest prefix, no exact match
    await mux(Task("image:crop"))
    await mux(Task("imx"))
    assert calls == ["image:resize", "image:", "im"]
    _, pattern = mux.match("image:resizex") or (None, "")
    assert pattern == "image:resize"
    assert mux.match("other") is None


@given(
    patterns=st.lists(st.text(alphabet="ab:", min_size=1, max_size=5), unique=True, max_size=8),
    task_type=st.text(alphabet="ab:", min_size=1, max_size=8),
)
def test_match_is_exact_or_longest_prefix(patterns: list[str], task_type: str) -> None:
    mux = ServeMux()
    for p in patterns:
        mux.handle(p, _recorder(p, []))
    found = mux.match(task_type)
    candidates = [p for p in patterns if task_type.startswith(p)]
    if task_type in patterns:
        assert found is not None and found[1] == task_type
    elif candidates:
        assert found is not None
        assert len(found[1]) == max(len(c) for c in candidates)
        assert task_type.startswith(found[1])
    else:
        assert found is None


async def test_not_found_raises_through_middleware() -> None:
    seen: list[str] = []

    def mw(next_: Handler) -> Handler:
        async def wrapped(task: Task) -> None:
            seen.append(f"before:{task.type}")
            await next_(task)

        return wrapped

    mux = ServeMux()
    mux.use(mw)
    with pytest.raises(HandlerNotFoundError) as err:
        await mux(Task("nobody:home"))
    assert str(err.value) == "handler not found for task 'nobody:home'"
    assert seen == ["before:nobody:home"]


async def test_middleware_first_registered_is_outermost() -> None:
    order: list[str] = []

    def make(name: str) -> Callable[[Handler], Handler]:
        def mw(next_: Handler) -> Handler:
            async def wrapped(task: Task) -> None:
                order.append(f"{name}>")
                await next_(task)
                order.append(f"<{name}")

            return wrapped

        return mw

    mux = ServeMux()
    mux.handle("t", _recorder("handler", order))
    mux.use(make("a"))
    mux.use(make("b"), make("c"))
    await mux(Task("t"))
    assert order == ["a>", "b>", "c>", "handler", "<c", "<b", "<a"]


async def test_middleware_added_later_applies_to_cached_handlers() -> None:
    order: list[str] = []
    mux = ServeMux()
    mux.handle("t", _recorder("h", order))
    await mux(Task("t"))

    def mw(next_: Handler) -> Handler:
        async def wrapped(task: Task) -> None:
            order.append("mw")
            await next_(task)

        return wrapped

    mux.use(mw)
    await mux(Task("t"))
    assert order == ["h", "mw", "h"]


def test_decorator_registers_and_returns_function() -> None:
    mux = ServeMux()

    @mux.handler("email:welcome")
    async def welcome(task: Task) -> None:
        return None

    assert welcome.__name__ == "welcome"
    found = mux.match("email:welcome")
    assert found is not None and found[0] is welcome


@pytest.mark.parametrize("pattern", ["", "   ", "\t"])
def test_blank_pattern_rejected(pattern: str) -> None:
    mux = ServeMux()
    with pytest.raises(ValueError, match="invalid handler pattern"):
        mux.handle(pattern, _recorder("x", []))


def test_duplicate_pattern_rejected() -> None:
    mux = ServeMux()
    mux.handle("a", _recorder("x", []))
    with pytest.raises(ValueError, match="multiple registrations for handler pattern 'a'"):
        mux.handle("a", _recorder("y", []))


def test_non_callable_rejected() -> None:
    mux = ServeMux()
    with pytest.raises(TypeError, match="must be callable"):
        mux.handle("a", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be callable"):
        mux.handle("a", "not a function")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pattern must be a str"):
        mux.handle(1, _recorder("x", []))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="middleware must be callable"):
        mux.use(42)  # type: ignore[arg-type]


async def test_sync_handler_runs_in_a_thread_without_blocking_the_loop() -> None:
    release = threading.Event()
    threads: list[int] = []

    def blocking(task: Task) -> None:
        threads.append(threading.get_ident())
        assert release.wait(10)

    mux = ServeMux()
    mux.handle("block", blocking)
    run = asyncio.create_task(mux(Task("block")))
    # The loop keeps running while the handler blocks its thread.
    for _ in range(200):
        if threads:
            break
        await asyncio.sleep(0.01)
    assert threads and threads[0] != threading.get_ident()
    assert not run.done()
    release.set()
    await asyncio.wait_for(run, 10)


async def test_sync_handler_exception_propagates() -> None:
    def failing(task: Task) -> None:
        raise ValueError("bad payload")

    mux = ServeMux()
    mux.handle("f", failing)
    with pytest.raises(ValueError, match="bad payload"):
        await mux(Task("f"))


async def test_async_callable_object_is_awaited_directly() -> None:
    calls: list[str] = []

    class Obj:
        async def __call__(self, task: Task) -> None:
            calls.append(task.type)

    mux = ServeMux()
    mux.handle("o", Obj())
    await mux(Task("o"))
    assert calls == ["o"]


def test_async_middleware_is_rejected_when_registered() -> None:
    mux = ServeMux()

    async def wrong(next_handler: Handler) -> Handler:
        return next_handler

    with pytest.raises(TypeError, match="is an async function"):
        mux.use(wrong)  # type: ignore[arg-type]
    assert "middlewares=0" in repr(mux)
