"""TurnBatcher: what one event-loop turn adds is sent as one batch."""

from __future__ import annotations

import asyncio

from asyncq._batch import TurnBatcher


async def test_one_turn_is_one_batch_and_aclose_sends_the_rest() -> None:
    sent: list[list[int]] = []

    async def send(batch: list[int]) -> None:
        sent.append(batch)

    batcher: TurnBatcher[int] = TurnBatcher(send)
    for i in range(5):
        batcher.add(i)
    assert sent == []  # nothing before the turn ends
    await asyncio.sleep(0)  # the flush runs at the end of this turn
    await asyncio.sleep(0)  # and its send in the next
    assert sent == [[0, 1, 2, 3, 4]]
    await asyncio.sleep(0)  # a turn with nothing added sends nothing
    batcher.add(5)
    batcher.add(6)
    await batcher.aclose()  # sends what is pending without waiting for the turn
    assert sent == [[0, 1, 2, 3, 4], [5, 6]]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sent == [[0, 1, 2, 3, 4], [5, 6]]  # the turn's own flush found it empty


async def test_one_send_at_a_time_and_in_order() -> None:
    """What is added while a send is in flight goes next, as one batch, after it."""
    release = asyncio.Event()
    landed: list[list[str]] = []

    async def send(batch: list[str]) -> None:
        if batch == ["a"]:
            await release.wait()  # a slow first send
        landed.append(batch)

    batcher: TurnBatcher[str] = TurnBatcher(send)
    batcher.add("a")
    for _ in range(3):
        await asyncio.sleep(0)
    batcher.add("b")  # another turn, while "a" is in flight
    for _ in range(3):
        await asyncio.sleep(0)
    batcher.add("c")
    for _ in range(3):
        await asyncio.sleep(0)
    assert landed == []
    release.set()
    await batcher.aclose()
    assert landed == [["a"], ["b", "c"]]


async def test_aclose_waits_for_the_sends_in_flight() -> None:
    release = asyncio.Event()
    done: list[list[str]] = []

    async def send(batch: list[str]) -> None:
        await release.wait()
        done.append(batch)

    batcher: TurnBatcher[str] = TurnBatcher(send)
    batcher.add("a")
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # "a" is being sent, held by release
    batcher.add("b")
    closing = asyncio.create_task(batcher.aclose())
    await asyncio.sleep(0.01)
    assert not closing.done() and done == []
    release.set()
    await asyncio.wait_for(closing, 5)
    assert done == [["a"], ["b"]]
