"""Dynamic queues: the live set of queues a server serves, from names and glob patterns.

``Server(queues={"tenant:*": 1, "critical": 5})``: a name holding ``*``, ``?``
or ``[`` is an fnmatch-style pattern (case-sensitive) matched against the
queue names in asynq's ``asynq:queues`` set (every queue ever enqueued to).
One :class:`QueueSet` per server holds what is served *now*; the
:class:`~asyncq._worker.queuewatcher.QueueWatcher` role re-reads the set (one SMEMBERS) every
``queue_refresh_interval`` and is the only writer. Every other role reads the
set when it needs the queue list, so a queue created after the server started
is fetched, forwarded, recovered, cleaned and woken up for, and a queue
removed from ``asynq:queues`` (``asyncq queue rm``) stops being served.

Resolution of one concrete queue name against a mapping of names and patterns
(:func:`resolve`, used for the priorities and the flow-control options): an
explicit name wins; otherwise the first pattern, in the mapping's order, that
matches. Explicit names are served whether or not they are in
``asynq:queues`` (as before); patterns only match queues that are.

Weights: with ``strict_priority`` every match of a pattern has the pattern's
priority. For weighted picking the pattern's weight is **split** among its
current matches (``w / n`` each), so a pattern matching 1000 tenant queues
gets, all together, the share its weight says, and does not starve the
explicit queues. The heartbeat (``ServerInfo.queues``, read by asynqmon and
the ``asynq`` CLI) lists the concrete queues, each with its entry's priority.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "QueuePlan",
    "QueueSet",
    "has_patterns",
    "is_pattern",
    "resolve",
    "validate_pattern",
]

_V = TypeVar("_V")
_SPECIAL = frozenset("*?[")


def is_pattern(name: str) -> bool:
    """Whether *name* is a glob pattern (holds ``*``, ``?`` or ``[``)."""
    return not _SPECIAL.isdisjoint(name)


def validate_pattern(option: str, pattern: str) -> None:
    """Raise ValueError naming *pattern* when its ``[...]`` classes are not well formed.

    fnmatch would read an unclosed ``[`` as a literal character, which is never
    what a queue pattern means. As in fnmatch, a ``]`` right after ``[`` (or
    ``[!``) is a member of the class, so ``[]`` is unclosed too.
    """
    i = 0
    n = len(pattern)
    while i < n:
        if pattern[i] == "[":
            j = i + 1
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1  # a leading ] is a member of the class
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                raise ValueError(f"{option}: bad queue pattern {pattern!r}: '[' is never closed")
            i = j
        i += 1


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(pattern))


def resolve(mapping: Mapping[str, _V], name: str) -> _V | None:
    """The value *mapping* gives the concrete queue *name*: its own entry, else the first
    matching pattern's, else None."""
    if name in mapping:
        return mapping[name]
    for key, value in mapping.items():
        if is_pattern(key) and fnmatch.fnmatchcase(name, key):
            return value
    return None


def has_patterns(names: Iterable[str]) -> bool:
    return any(is_pattern(n) for n in names)


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """What a refresh would change: the new served names and their entries."""

    entries: dict[str, str]
    """Concrete queue name -> the key of ``queues`` it comes from (itself or a pattern)."""
    added: frozenset[str]
    removed: frozenset[str]


class QueueSet:
    """The concrete queues a server serves now; see the module docstring.

    Readers take :meth:`names`, :attr:`priorities` or :attr:`weights` when they
    need them (each a new snapshot after a change, never mutated in place) and
    may compare :attr:`version` to rebuild what they derive from it.
    """

    __slots__ = ("_configured", "_entries", "_patterns", "priorities", "version", "weights")

    def __init__(self, queues: Mapping[str, int]) -> None:
        self._configured = dict(queues)
        self._patterns = [(p, _compile(p)) for p in queues if is_pattern(p)]
        self.version = 0
        self._entries: dict[str, str] = {}
        self.priorities: Mapping[str, int] = {}
        """Concrete queue -> its entry's priority (strict order, the heartbeat)."""
        self.weights: Mapping[str, float] = {}
        """Concrete queue -> its weight for weighted picking (a pattern's split)."""
        self._set({n: n for n in queues if not is_pattern(n)})

    @property
    def dynamic(self) -> bool:
        """Whether any pattern is configured (else the set never changes)."""
        return bool(self._patterns)

    @property
    def configured(self) -> Mapping[str, int]:
        """The ``queues`` option as given (names and patterns)."""
        return self._configured

    def names(self) -> list[str]:
        """The queues served now."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def plan(self, known: Collection[str]) -> QueuePlan:
        """The served set for the queues *known* to exist (``asynq:queues``)."""
        entries = {n: n for n in self._configured if not is_pattern(n)}
        for name in sorted(known):
            if name in entries or not name.strip() or "{" in name or "}" in name:
                continue  # explicit names win; unusable names are never served
            for pattern, regex in self._patterns:
                if regex.match(name):
                    entries[name] = pattern
                    break
        old = self._entries.keys()
        return QueuePlan(entries, frozenset(entries.keys() - old), frozenset(old - entries.keys()))

    def apply(self, plan: QueuePlan) -> None:
        if plan.entries != self._entries:
            self._set(plan.entries)

    def _set(self, entries: dict[str, str]) -> None:
        matches: dict[str, int] = {}
        for entry in entries.values():
            matches[entry] = matches.get(entry, 0) + 1
        conf = self._configured
        self.priorities = {n: conf[e] for n, e in entries.items()}
        self.weights = {n: conf[e] / matches[e] for n, e in entries.items()}
        self._entries = entries
        self.version += 1
