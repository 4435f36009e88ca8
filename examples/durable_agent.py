"""A durable agent loop: a model decides, tools act, a human approves the risky action.

A support ticket comes in. The run asks the model what to do next (a step: the model
call is an ordinary task, its answer recorded), runs the tool the model chose (another
step), and loops until the model replies. A refund needs a human's approval: the run
waits for the ``refund:approval`` signal of its ticket, holding no worker, for as long
as the human takes (seconds here; hours in production). Every model answer and tool
result is recorded, so a crash or a redeploy in the middle costs no second model call
and no second refund: the run replays its record and goes on from its last step.

The model here is a small scripted policy so that the example runs offline and always
prints the same; a real one (an HTTP call to an LLM) goes in ``think`` unchanged::

    python examples/durable_agent.py

Which Redis: ``ASYNCQ_REDIS_URL`` when set; else the Redis on 127.0.0.1:6379 when one
answers; else a throwaway server started for this run (see examples/main_job.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta
from typing import Any

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncq import App, Intervals, Run
from asyncq.devserver import ServerNotFoundError, example_redis

QUEUE = "agent-example"
APPROVAL_WAIT = timedelta(seconds=10)  # hours, in production
MAX_TURNS = 6

app = App()
ORDERS = {"A-100": {"item": "kettle", "price": 40, "damaged": True}}
refunds: list[str] = []  # the tool's side effect: each refund must happen at most once


@app.task(name="agent:think", queue=QUEUE)
async def think(ticket: str, transcript: list[dict[str, Any]]) -> dict[str, Any]:
    """The model: what to do next, given the ticket and what the tools said so far."""
    said = {turn["tool"]: turn["result"] for turn in transcript}
    order_id = ticket.rsplit(maxsplit=1)[-1]
    if "lookup_order" not in said:
        return {"tool": "lookup_order", "args": {"order_id": order_id}}
    order = said["lookup_order"]
    if order is None:
        return {"reply": f"I could not find order {order_id}."}
    if order["damaged"] and "refund" not in said:
        return {"tool": "refund", "args": {"order_id": order_id, "amount": order["price"]}}
    if said.get("refund"):
        return {"reply": f"Sorry about the {order['item']}: {said['refund']}."}
    return {"reply": f"A refund for the {order['item']} was declined; a colleague will call."}


@app.task(name="agent:lookup_order", queue=QUEUE)
async def lookup_order(order_id: str) -> dict[str, Any] | None:
    return ORDERS.get(order_id)


@app.task(name="agent:refund", queue=QUEUE)
async def refund(order_id: str, amount: int) -> str:
    refunds.append(f"refunded {amount} on {order_id}")
    return f"{amount} refunded on {order_id}"


@app.durable(name="agent:support", queue=QUEUE)
async def support(run: Run, ticket_id: str, ticket: str) -> str:
    transcript: list[dict[str, Any]] = []
    for _ in range(MAX_TURNS):
        decision = await run.step(think, ticket, transcript)
        if "reply" in decision:
            return str(decision["reply"])
        tool, args = decision["tool"], decision["args"]
        if tool == "lookup_order":
            result: Any = await run.step(lookup_order, args["order_id"])
        elif tool == "refund":
            # Money moves only with a human's yes; the run holds no worker meanwhile.
            answer = await run.wait_for("refund:approval", key=ticket_id, timeout=APPROVAL_WAIT)
            approved = bool(answer and answer.get("approved"))
            result = await run.step(refund, args["order_id"], args["amount"]) if approved else ""
        else:
            raise ValueError(f"the model chose an unknown tool {tool!r}")
        transcript.append({"tool": tool, "result": result})
    return f"no answer after {MAX_TURNS} turns; handed to a human"


async def main(redis_url: str) -> int:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    app.redis = redis_url
    try:
        await app.client.ping()
    except (RedisConnectionError, ConnectionRefusedError) as exc:
        print(f"error: cannot connect to Redis at {redis_url}: {exc}", file=sys.stderr)
        return 1
    except RedisTimeoutError as exc:
        print(f"error: Redis at {redis_url} did not answer in time: {exc}", file=sys.stderr)
        return 1
    server = app.server(
        queues={QUEUE: 1},
        concurrency=4,
        shutdown_timeout=timedelta(seconds=5),
        intervals=Intervals(delayed_task_check=timedelta(milliseconds=200)),
    )
    async with server:
        await server.start(app.mux)
        handles = {
            "T-1": await support.start("T-1", "my kettle arrived broken, order A-100"),
            "T-2": await support.start("T-2", "the lid is cracked, order A-100"),
        }
        # A human reviews the two refunds: yes to the first, no to the second.
        await app.signal("refund:approval", key="T-1", payload={"approved": True, "by": "ana"})
        await app.signal("refund:approval", key="T-2", payload={"approved": False, "by": "ana"})
        for ticket_id, handle in handles.items():
            print(f"{ticket_id}: {await handle.result(timeout=30)}")
        await server.shutdown()
    await app.aclose()
    print("\n".join(refunds))
    return 0


def run() -> int:
    try:
        with example_redis() as url:
            return asyncio.run(main(url))
    except ServerNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(run())
