"""The Redis broker: every state transition of a task as one Lua script call."""

from asyncq.broker.broker import BatchItem, Broker, DequeuedTask

__all__ = ["BatchItem", "Broker", "DequeuedTask"]
