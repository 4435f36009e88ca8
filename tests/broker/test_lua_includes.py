"""The scripts' shared Lua code (``lua/_lib/*.lua``) is written once and expanded at load."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from asyncq._redis.scripts import read_script

LUA = Path(__file__).resolve().parents[2] / "asyncq" / "_broker" / "lua"


def _fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripts: dict[str, str]) -> str:
    package = tmp_path / "fakelua"
    (package / "lua" / "_lib").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "lua" / "_lib" / "one.lua").write_text("local function one()\n    return 1\nend\n")
    (package / "lua" / "_lib" / "two.lua").write_text("local two = 2\n")
    for name, text in scripts.items():
        (package / "lua" / f"{name}.lua").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fakelua", raising=False)
    return "fakelua"


def test_an_include_line_is_replaced_by_the_named_files_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _fake_package(
        tmp_path, monkeypatch, {"s": "-- include: two, one\n-- the body\nreturn one() + two\n"}
    )
    assert read_script(package, "s") == (
        "local two = 2\nlocal function one()\n    return 1\nend\n-- the body\nreturn one() + two\n"
    )


def test_a_script_without_includes_is_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "-- a comment naming include: nothing\nreturn 1\n"
    package = _fake_package(tmp_path, monkeypatch, {"s": text})
    assert read_script(package, "s") == text


def test_a_missing_include_names_the_script_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _fake_package(tmp_path, monkeypatch, {"s": "-- include: one, nope\nreturn 1\n"})
    with pytest.raises(FileNotFoundError, match=r"lua/s\.lua includes 'nope'.*lua/_lib/nope\.lua"):
        read_script(package, "s")


def test_an_empty_include_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = _fake_package(tmp_path, monkeypatch, {"s": "-- include: one,\nreturn 1\n"})
    with pytest.raises(FileNotFoundError, match=r"includes ''"):
        read_script(package, "s")


def test_every_script_loads_with_its_includes_expanded_once() -> None:
    for path in LUA.glob("*.lua"):
        source = read_script("asyncq._broker", path.stem)
        assert "-- include:" not in source, path.name
        assert source.count("local function bad(") <= 1, path.name
        if "bad(" in source:
            assert "local function bad(" in source, f"{path.name} calls bad() without the guard"
        for fn in ("count_day(", "count_total("):
            if fn in source:
                assert f"local function {fn}" in source, f"{path.name}: {fn} not included"


def test_the_shared_code_lives_once() -> None:
    for path in LUA.glob("*.lua"):
        text = path.read_text()
        assert "local function bad(" not in text, f"{path.name} copies the guard"
        assert "local function count_" not in text, f"{path.name} copies the counters"
