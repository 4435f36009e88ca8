"""The replay engine (asyncq.durable.Run) as a property, without Redis or a worker: a
random durable program is run attempt after attempt against a record that each
suspension's plan updates as the scripts would (steps run and recorded, time passes),
with crashes at random points: before the suspension is written, and after a step ran
but before its result was recorded. Whatever the crashes, the program ends with the
result it has when run straight through, and no step whose result was recorded ever
runs again."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncq._broker.durable import RunSuspended
from asyncq._redis.options import RedisClient
from asyncq.durable import Run
from asyncq.task import Task


class Double:
    """A step task doubling its argument (the protocol run.step takes)."""

    def to_task(self, n: int) -> Task:
        return Task("h:double", json.dumps({"n": n}).encode(), retention=None)

    def _decode_result(self, data: bytes | None) -> int:
        return int(json.loads(data or b"0"))


DOUBLE = Double()

op = st.one_of(
    st.tuples(st.just("step"), st.integers(0, 50)),
    st.tuples(st.just("gather"), st.lists(st.integers(0, 50), min_size=1, max_size=4)),
    st.tuples(st.just("call"), st.integers(0, 50)),
    st.tuples(st.just("sleep"), st.integers(1, 100)),
    st.tuples(st.just("branch"), st.integers(0, 50)),
)


async def program(run: Run, ops: list[tuple[str, Any]]) -> list[int]:
    out: list[int] = []
    for kind, arg in ops:
        if kind == "step":
            out.append(await run.step(DOUBLE, arg))
        elif kind == "gather":
            out.extend(await run.gather(*(run.step(DOUBLE, a) for a in arg)))
        elif kind == "call":
            out.append(await run.call(lambda a=arg: a + 1))
        elif kind == "sleep":
            await run.sleep(timedelta(seconds=arg))
        elif (out[-1] if out else 0) % 2 == 0:  # a branch on what was recorded
            out.append(await run.step(DOUBLE, arg + 1000))
    return out


def straight(ops: list[tuple[str, Any]]) -> list[int]:
    out: list[int] = []
    for kind, arg in ops:
        if kind == "step":
            out.append(2 * arg)
        elif kind == "gather":
            out.extend(2 * a for a in arg)
        elif kind == "call":
            out.append(arg + 1)
        elif kind == "branch" and (out[-1] if out else 0) % 2 == 0:
            out.append(2 * (arg + 1000))
    return out


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=10), crashes=st.lists(st.integers(0, 3), max_size=40))
async def test_replay_ends_as_a_straight_run_and_recorded_steps_never_rerun(
    ops: list[tuple[str, Any]], crashes: list[int]
) -> None:
    record: dict[str, bytes] = {}
    now = [1000.0]
    runs: Counter[str] = Counter()  # step id -> times its task ran
    unrecorded: set[str] = set()  # steps that ran and whose worker died before the record
    crash = iter(crashes)
    for _ in range(200):
        run = Run("r", "q", record, redis=cast(RedisClient, None), clock=lambda: now[0])
        try:
            result = await program(run, ops)
        except RunSuspended as suspended:
            fate = next(crash, 0)
            if fate == 1:
                continue  # the worker died before the suspension was written: nothing is
            plan = suspended.plan
            for name, value in plan.records.items():
                record.setdefault(name, value)
            for index, msg in plan.steps:
                if f"r:{index}" in record:
                    continue
                assert msg.id == f"r-{index}"
                runs[msg.id] += 1
                if fate == 2:
                    unrecorded.add(msg.id)
                    break  # a step ran, then its worker died before the acknowledgement
                record[f"r:{index}"] = str(2 * json.loads(msg.payload)["n"]).encode()
            if plan.until is not None:
                now[0] = max(now[0], plan.until)
            continue
        break
    else:
        raise AssertionError("the program never ended")
    assert result == straight(ops)
    # a step runs again only after a crash took it between its run and its record
    assert {s for s, n in runs.items() if n > 1} <= unrecorded
    assert set(runs) == {
        f"r-{int(k[2:])}" for k in record if k.startswith("s:") and record[k].startswith(b"step")
    }  # every step asked for ran
