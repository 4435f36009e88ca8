"""Optional features of the command line and the extra that installs each one."""

from __future__ import annotations

import importlib
from types import ModuleType

from asyncq.cli._app import CliError

__all__ = ["require_extra"]


def require_extra(module: str, extra: str, feature: str) -> ModuleType:
    """Import *module*, or fail with a CliError naming the extra that installs it.

    >>> require_extra("textual", "dash", "asyncq dash")  # doctest: +SKIP
    error: asyncq dash needs the 'dash' extra: pip install 'asyncq[dash]' (no module 'textual')
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise CliError(
            f"{feature} needs the {extra!r} extra: pip install 'asyncq[{extra}]' "
            f"(no module {module!r})"
        ) from None
