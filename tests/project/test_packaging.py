"""Packaging: a lean core, extras that commands name when missing, one version everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import asyncq
from asyncq.cli import main

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OPTIONAL = (
    "textual",
    "uvloop",
    "watchfiles",
    "starlette",
    "uvicorn",
    "jinja2",
    "prometheus_client",
    "opentelemetry",
)


def test_core_dependencies_are_lean() -> None:
    names = {
        d.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()
        for d in PYPROJECT["project"]["dependencies"]
    }
    assert not names & {"textual", "uvloop", "watchfiles", "starlette", "uvicorn", "jinja2"}
    assert {"redis", "betterproto2", "anyio", "structlog", "croniter", "click"} <= names


def test_all_extra_includes_every_feature_extra() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    (everything,) = extras["all"]
    listed = set(everything.split("[", 1)[1].rstrip("]").split(","))
    # dev, docs and examples (Pillow for the main job) serve the repository, not a feature.
    features = set(extras) - {"all", "dev", "docs", "examples"}
    assert listed == features
    assert {"dash", "uvloop", "web", "metrics", "otel", "gateway", "embedded"} <= features


def test_core_imports_without_the_optional_packages() -> None:
    # Block the optional packages as if they were not installed, then use the core.
    code = (
        "import sys\n"
        f"for name in {OPTIONAL!r}: sys.modules[name] = None\n"
        "import asyncq, asyncq.cli\n"
        "from asyncq import Client, Inspector, Scheduler, ServeMux, Server, Task\n"
        "asyncq.cli.main(['--help'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "worker" in result.stdout


@pytest.mark.parametrize(
    ("blocked", "args", "message"),
    [
        ("textual", ["dash"], "asyncq dash needs the 'dash' extra: pip install 'asyncq[dash]'"),
        (
            "watchfiles",
            ["worker", "pkgapp:mux", "--reload"],
            "--reload needs the 'reload' extra: pip install 'asyncq[reload]'",
        ),
        (
            "uvloop",
            ["worker", "pkgapp:mux", "--loop", "uvloop"],
            "--loop uvloop needs the 'uvloop' extra: pip install 'asyncq[uvloop]'",
        ),
    ],
)
def test_a_command_names_its_missing_extra(
    blocked: str,
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    redis_url: str,
) -> None:
    (tmp_path / "pkgapp.py").write_text("from asyncq import ServeMux\nmux = ServeMux()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, blocked, None)
    monkeypatch.delitem(sys.modules, "asyncq.cli.dash", raising=False)
    try:
        result = CliRunner().invoke(main, ["-u", redis_url, *args])
    finally:
        sys.modules.pop("pkgapp", None)
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {message} (no module {blocked!r})"


def test_auto_loop_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncq.cli.worker import _loop_factory

    assert _loop_factory("asyncio") is None
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert _loop_factory("auto") is None


def test_auto_loop_uses_uvloop_when_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    from asyncq.cli.worker import _loop_factory

    assert _loop_factory("auto") is uvloop.new_event_loop


def test_version_has_one_source() -> None:
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "asyncq.__version__"}
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"asyncq, version {asyncq.__version__}"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {asyncq.__version__}" in changelog


def test_metadata_files() -> None:
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "asyncq" / "py.typed").exists()
    classifiers = PYPROJECT["project"]["classifiers"]
    for version in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert PYPROJECT["project"]["urls"]
