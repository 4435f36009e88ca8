"""The one door: :class:`WorkerBroker` lists the calls the roles make, and both the Redis
``Broker`` and the in-memory ``FakeBroker`` the role tests run on answer every one of
them with the same parameters (mypy checks ``Broker`` where the server wires it; nothing
else would notice the fake drifting from the protocol, and a role test on a drifted fake
proves nothing about the real broker)."""

from __future__ import annotations

import inspect

import pytest

from asyncq._broker.broker import Broker
from asyncq._worker.broker import WorkerBroker
from tests.support.fakebroker import FakeBroker

CALLS = sorted(
    name
    for name, value in vars(WorkerBroker).items()
    if not name.startswith("_") and inspect.isfunction(value)
)


def _parameters(func: object) -> list[tuple[str, inspect._ParameterKind]]:
    params = list(inspect.signature(func).parameters.values())  # type: ignore[arg-type]
    return [(p.name, p.kind) for p in params]


def test_the_protocol_lists_calls() -> None:
    assert len(CALLS) >= 15, CALLS  # the roles' calls, not an empty protocol


@pytest.mark.parametrize("impl", [Broker, FakeBroker], ids=["Broker", "FakeBroker"])
@pytest.mark.parametrize("name", CALLS)
def test_every_call_is_implemented_with_the_protocols_parameters(impl: type, name: str) -> None:
    method = getattr(impl, name, None)
    assert method is not None, f"{impl.__name__} has no {name}()"
    assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(
        getattr(WorkerBroker, name)
    ), f"{impl.__name__}.{name} and the protocol disagree on async"
    assert _parameters(method) == _parameters(getattr(WorkerBroker, name)), name
