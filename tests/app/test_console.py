"""``import asyncq`` loads each public name on first use; the console script's start-up."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import FunctionType

import pytest

import asyncq


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _loaded_after(statement: str) -> set[str]:
    done = _python(f"""
        import sys
        {statement}
        print(" ".join(m for m in sys.modules if m.startswith("asyncq")))
    """)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_import_asyncq_loads_neither_the_worker_nor_the_inspector_nor_the_broker() -> None:
    loaded = _loaded_after("import asyncq")
    assert "asyncq.progress" in loaded  # bound at once: asyncq.progress is also a module
    assert not {m for m in loaded if m.startswith(("asyncq._worker", "asyncq._broker"))}
    assert not {"asyncq._inspection.inspector", "asyncq.app", "asyncq.cli"} & loaded


def test_a_producer_loads_the_client_and_not_the_worker() -> None:
    loaded = _loaded_after("from asyncq import Client, Task")
    assert {"asyncq._producer.client", "asyncq.task"} <= loaded
    assert not {m for m in loaded if m.startswith(("asyncq._worker", "asyncq._inspection"))}


@pytest.mark.parametrize("name", sorted(set(asyncq.__all__) - {"__version__"}))
def test_every_public_name_resolves_under_its_public_path(name: str) -> None:
    obj = getattr(asyncq, name)
    assert name in dir(asyncq)
    if isinstance(obj, type | FunctionType):  # none presents a private module's path
        assert not obj.__module__.startswith("asyncq._"), obj.__module__


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="module 'asyncq' has no attribute 'Clinet'"):
        asyncq.Clinet  # type: ignore[attr-defined]  # noqa: B018


def test_from_asyncq_import_progress_is_the_function_after_its_module_loads() -> None:
    done = _python("""
        import asyncq.progress
        from asyncq import progress
        print(type(progress).__name__)
    """)
    assert done.stdout.strip() == "function", done.stderr


def test_ctrl_c_while_the_command_line_loads_is_one_line_and_status_130() -> None:
    # A KeyboardInterrupt raised by the import of asyncq.cli stands for a Ctrl-C at a
    # random moment of the start-up; the one window left is before asyncq._console runs.
    done = _python("""
        import sys

        class Interrupt:
            def find_spec(self, name, path=None, target=None):
                if name == "asyncq.cli":
                    raise KeyboardInterrupt
                return None

        sys.meta_path.insert(0, Interrupt())
        sys.argv = ["asyncq", "--version"]
        from asyncq._console import main
        main()
    """)
    assert (done.returncode, done.stderr, done.stdout) == (130, "error: interrupted\n", "")


def test_the_console_script_runs_the_command_line() -> None:
    done = _python("""
        import sys
        sys.argv = ["asyncq", "--version"]
        from asyncq._console import main
        main()
    """)
    assert done.returncode == 0, done.stderr
    assert asyncq.__version__ in done.stdout
