"""Run r1 and its steps, as the durable scripts' tests drive them without a worker."""

from __future__ import annotations

from asyncq import Client, Task
from asyncq._broker import Broker
from asyncq._broker.durable import RUN_HEADER, RUN_QUEUE_HEADER, STEP_HEADER
from asyncq.proto.asynq import TaskMessage
from tests.support import transitions

Q = "default"


async def active_run(broker: Broker, client: Client) -> TaskMessage:
    """A run task r1 of queue default taken by a worker (active, leased)."""
    await client.enqueue(Task("run", b"{}"), task_id="r1")
    got = await transitions.dequeue(broker, [Q])
    assert got is not None
    return got.message


def step_message(index: int, queue: str = Q) -> TaskMessage:
    """Step *index* of run r1 (in *queue*), as a suspension enqueues it."""
    return TaskMessage(
        type="step",
        payload=b"{}",
        id=f"r1-{index}",
        queue=queue,
        retry=1,
        retention=60,
        headers={RUN_HEADER: "r1", RUN_QUEUE_HEADER: Q, STEP_HEADER: str(index)},
    )
