"""JSON codecs for typed tasks: a function's arguments and its return value.

Built on pydantic v2's ``TypeAdapter`` (the reasons are in docs/typed-api.md):
one adapter for the arguments, seen as a TypedDict keyed by parameter name,
and one for the return annotation. Annotations are resolved on first use, so
a task may name types defined after it (``from __future__ import annotations``).

Payload shape (what a Go handler reads): one JSON object, a key per
parameter in declaration order, every parameter present (defaults filled
in)::

    async def send_welcome(user_id: int, lang: str = "en") -> Receipt: ...
    # payload of send_welcome.enqueue(42): {"user_id":42,"lang":"en"}

Producing is strict (mypy-like: ``"42"`` is not an int); consuming is lax
(JSON strings become datetimes, UUIDs...), so Go producers need no care.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn, NotRequired, Required, cast

import pydantic
from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError
from typing_extensions import TypedDict

from asyncq.errors import AsyncqError

__all__ = ["ArgumentsCodec", "ResultCodec", "TaskArgumentError", "TaskResultError"]

_EMPTY = inspect.Parameter.empty


class TaskArgumentError(AsyncqError, TypeError):
    """A typed task got arguments it cannot take or that do not fit its annotations."""


class TaskResultError(AsyncqError, ValueError):
    """A task result does not match the task's return annotation."""


def _describe(task: str, exc: ValidationError, what: str) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = err.get("loc", ())
        name = ".".join(str(p) for p in loc) if loc else "<payload>"
        parts.append(f"{what} {name!r}: {err.get('msg', 'invalid')}")
    return f"{task}: " + "; ".join(parts)


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise TypeError(
            f"cannot resolve the annotations of {fn.__qualname__}: {exc} "
            "(define the types before the first enqueue or handler run)"
        ) from None


class ArgumentsCodec:
    """Binds, validates and encodes a function's arguments; decodes them for the handler."""

    __slots__ = (
        "_adapter",
        "_defaults",
        "_exact",
        "_fn",
        "_index",
        "_names",
        "_positional",
        "_positional_only",
        "_task",
    )

    def __init__(self, fn: Callable[..., Any], task: str) -> None:
        self._fn = fn
        self._task = task
        sig = inspect.signature(fn)
        names: list[str] = []
        defaults: dict[str, Any] = {}
        positional: list[str] = []
        positional_only: list[str] = []
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(
                    f"task {task}: *args/**kwargs parameters cannot be typed as a JSON object "
                    f"({p.name!r}); name every parameter"
                )
            names.append(p.name)
            if p.default is not _EMPTY:
                defaults[p.name] = p.default
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                positional.append(p.name)
            if p.kind is p.POSITIONAL_ONLY:
                positional_only.append(p.name)
        self._names = tuple(names)
        self._index = frozenset(names)
        self._defaults = defaults
        self._positional = tuple(positional)
        self._positional_only = tuple(positional_only)
        self._adapter: TypeAdapter[dict[str, Any]] | None = None
        self._exact: tuple[type, ...] | None = None  # the annotations, if all str/int/float/bool

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def _get_adapter(self) -> TypeAdapter[dict[str, Any]]:
        if self._adapter is None:
            hints = _hints(self._fn)
            fields: dict[str, Any] = {}
            for name in self._names:
                hint = hints.get(name, Any)
                fields[name] = NotRequired[hint] if name in self._defaults else Required[hint]
            td = TypedDict(f"{self._task}_arguments", fields)  # type: ignore[misc]
            td.__pydantic_config__ = pydantic.ConfigDict(  # type: ignore[attr-defined]
                extra="forbid", arbitrary_types_allowed=False
            )
            self._adapter = cast(TypeAdapter[dict[str, Any]], TypeAdapter(td))
            # Strict validation of these annotations accepts exactly these types, so a
            # value of exactly the type needs no validator run (the common fast path).
            simple = tuple(hints.get(n, Any) for n in self._names)
            if all(t in (str, int, float, bool) for t in simple):
                self._exact = simple
        return self._adapter

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by name in declaration order, defaults filled in.

        Refuses what Python would refuse, with Python's wording.
        """
        given = len(args)
        if given > len(self._positional):
            raise TaskArgumentError(
                f"{self._task}() takes {len(self._positional)} positional arguments "
                f"but {given} were given"
            )
        if not kwargs and given == len(self._names):
            return dict(zip(self._names, args, strict=True))  # the common case, already ordered
        values = dict(zip(self._positional, args, strict=False))
        if kwargs:
            keys = kwargs.keys()
            if (
                not keys <= self._index
                or (given and not keys.isdisjoint(values))
                or (self._positional_only and not keys.isdisjoint(self._positional_only))
            ):
                self._refuse_keywords(values, keys)
            values.update(kwargs)
        if len(values) < len(self._names):
            missing = [n for n in self._names if n not in values and n not in self._defaults]
            if missing:
                raise TaskArgumentError(
                    f"{self._task}() missing required argument{'s' if len(missing) > 1 else ''}: "
                    + ", ".join(repr(n) for n in missing)
                )
            defaults = self._defaults
            return {n: values[n] if n in values else defaults[n] for n in self._names}
        return {n: values[n] for n in self._names}

    def _refuse_keywords(self, values: Mapping[str, Any], keys: Iterable[str]) -> NoReturn:
        for name in keys:
            if name not in self._index:
                raise TaskArgumentError(
                    f"{self._task}() got an unexpected keyword argument {name!r}"
                )
            if name in self._positional_only:
                raise TaskArgumentError(
                    f"{self._task}() got a positional-only argument passed as keyword: {name!r}"
                )
            if name in values:
                raise TaskArgumentError(f"{self._task}() got multiple values for argument {name!r}")
        raise AssertionError("no refused keyword found")  # pragma: no cover

    def encode(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bytes:
        """Bind, check strictly and encode as the JSON object payload."""
        bound = self.bind(args, kwargs)
        adapter = self._get_adapter()
        exact = self._exact
        # bound is in declaration order, as _exact is
        if exact is not None and tuple(map(type, bound.values())) == exact:
            checked = bound  # only str/int/float/bool values of exactly their annotated type
        else:
            try:
                checked = adapter.validator.validate_python(bound, strict=True)
            except ValidationError as exc:
                raise TaskArgumentError(_describe(self._task, exc, "argument")) from None
        try:
            return adapter.serializer.to_json(checked)  # TypeAdapter.dump_json without its wrapper
        except PydanticSerializationError as exc:
            raise TaskArgumentError(f"{self._task}: arguments not serializable: {exc}") from None

    def encode_without(self, hole: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bytes:
        """Encode every argument but *hole* (a workflow fills it in with a result later).

        *args* and *kwargs* are bound as if *hole*, the first parameter, were
        given; the payload has no key for it. Checked strictly, as :meth:`encode`.
        """
        if not self._positional or self._positional[0] != hole:
            raise TaskArgumentError(
                f"{self._task}: the result goes to the first positional parameter, "
                f"{hole!r} is not it"
            )
        bound = self.bind((None, *args), kwargs)
        del bound[hole]
        adapter = self._partial_adapter(hole)
        try:
            checked = adapter.validator.validate_python(bound, strict=True)
        except ValidationError as exc:
            raise TaskArgumentError(_describe(self._task, exc, "argument")) from None
        try:
            return adapter.serializer.to_json(checked)
        except PydanticSerializationError as exc:
            raise TaskArgumentError(f"{self._task}: arguments not serializable: {exc}") from None

    def _partial_adapter(self, hole: str) -> TypeAdapter[dict[str, Any]]:
        hints = _hints(self._fn)
        fields: dict[str, Any] = {}
        for name in self._names:
            if name != hole:
                hint = hints.get(name, Any)
                fields[name] = NotRequired[hint] if name in self._defaults else Required[hint]
        td = TypedDict(f"{self._task}_arguments_but_{hole}", fields)  # type: ignore[misc]
        td.__pydantic_config__ = pydantic.ConfigDict(  # type: ignore[attr-defined]
            extra="forbid", arbitrary_types_allowed=False
        )
        return cast(TypeAdapter[dict[str, Any]], TypeAdapter(td))

    def hints(self) -> dict[str, Any]:
        """The parameters' annotations by name (``Any`` for unannotated ones)."""
        hints = _hints(self._fn)
        return {name: hints.get(name, Any) for name in self._names}

    def decode(self, payload: bytes | None) -> dict[str, Any]:
        """The payload's arguments, converted to the annotated types (ValueError if not)."""
        try:
            return self._get_adapter().validate_json(payload or b"{}")
        except ValidationError as exc:
            # The whole sentence a stored error and the Failures page show, the task named once.
            detail = _describe(self._task, exc, "payload field")
            raise TaskArgumentError(f"invalid payload for {detail}") from None

    def call(self, fn: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        """Call *fn* with decoded arguments (positional-only ones positionally)."""
        if not self._positional_only:
            return fn(**arguments)
        args = [arguments.pop(n) for n in self._positional_only if n in arguments]
        return fn(*args, **arguments)


class ResultCodec:
    """Encodes a handler's return value; decodes a stored result for the waiter."""

    __slots__ = ("_adapter", "_fn", "_task")

    def __init__(self, fn: Callable[..., Any], task: str) -> None:
        self._fn = fn
        self._task = task
        self._adapter: TypeAdapter[Any] | None = None

    def _get_adapter(self) -> TypeAdapter[Any]:
        if self._adapter is None:
            hint = _hints(self._fn).get("return", Any)
            origin = typing.get_origin(hint)
            if origin is not None and origin in (typing.Awaitable, typing.Coroutine):
                hint = typing.get_args(hint)[-1]
            self._adapter = TypeAdapter(hint)
        return self._adapter

    def hint(self) -> Any:
        """The return annotation (awaited for a coroutine), ``Any`` when there is none."""
        hint = _hints(self._fn).get("return", Any)
        origin = typing.get_origin(hint)
        if origin is not None and origin in (typing.Awaitable, typing.Coroutine):
            hint = typing.get_args(hint)[-1]
        return hint

    def encode(self, value: Any) -> bytes:
        try:
            return self._get_adapter().dump_json(value, warnings="error")
        except (PydanticSerializationError, ValueError, TypeError) as exc:
            raise TaskResultError(
                f"{self._task}: the return value ({type(value).__name__}) cannot be "
                f"serialized as JSON for its return annotation: {exc}"
            ) from None

    def decode(self, data: bytes | None) -> Any:
        try:
            return self._get_adapter().validate_json(data if data else b"null")
        except ValidationError as exc:
            raise TaskResultError(_describe(self._task, exc, "result field")) from None
