"""The tests are laid out like the package (docs/testing.md, Layout): each test file in the
folder of the code it tests, shared harnesses in tests/support/, no test file importing
another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import layout

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_file_sits_flat_in_tests() -> None:
    flat = [p.name for p in layout.flat_test_files()]
    assert flat == [], f"place them in their folders: python -m tests.support.layout ({flat})"


def test_each_folder_of_tests_is_a_package_the_layout_names() -> None:
    folders = {p.parent for p in TESTS.rglob("test_*.py")}
    assert {f.name for f in folders if f.parent == TESTS} <= set(layout.FOLDERS)
    assert all(f.parent == TESTS for f in folders), "one level of folders"
    assert all((f / "__init__.py").is_file() for f in folders)


def _imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_no_file_imports_a_test_file() -> None:
    offenders = {
        str(path.relative_to(TESTS.parent)): sorted(bad)
        for path in TESTS.rglob("*.py")
        if (
            bad := {
                m for m in _imported(path)
                if m.startswith("tests.") and m.split(".")[-1].startswith(("test_", "conftest"))
            }
        )
    }  # fmt: skip
    assert offenders == {}, "import shared code from tests/support/"


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("test_processor_drain.py", "worker"),
        ("test_delivery_processor.py", "worker"),
        ("test_delivery_edges.py", "broker"),
        ("test_workflow_web.py", "web"),
        ("test_hostile_thing.py", None),
    ],
)
def test_a_new_file_is_placed_by_its_name(name: str, folder: str | None) -> None:
    assert layout.folder_for(name) == folder


def test_old_harness_imports_are_rewritten() -> None:
    old = (
        "from tests.helpers import wait_until\n"
        "from tests.workers.support import FAST\n"
        "from tests.workers.worker import STARTS\n"
        "from tests import gofixtures as go\n"
        "from tests.test_roles_fake_broker import Running\n"
        "from tests.support.helpers import FakeClock\n"
    )
    assert layout.rewrite_imports(old) == (
        "from tests.support.helpers import wait_until\n"
        "from tests.support.procs import FAST\n"
        "from tests.support.workers.worker import STARTS\n"
        "from tests.support import gofixtures as go\n"
        "from tests.support.roles import Running\n"
        "from tests.support.helpers import FakeClock\n"
    )
