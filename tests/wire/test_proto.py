"""asynq's protobuf messages: golden bytes built by hand from the wire rules, Go's zero
time, and a check that the committed generated code matches a fresh generation."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from asyncq._time import GO_ZERO_TIME, GO_ZERO_UNIX
from asyncq.proto.asynq import (
    SchedulerEnqueueEvent,
    SchedulerEntry,
    ServerInfo,
    TaskMessage,
    WorkerInfo,
)
from tests.support.gofixtures import varint

ROOT = Path(__file__).resolve().parents[2]

VARINT, LEN = 0, 2


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def int_field(field: int, value: int) -> bytes:
    return tag(field, VARINT) + varint(value)


def len_field(field: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return tag(field, LEN) + varint(len(data)) + data


def map_entry(field: int, key: str, value: bytes) -> bytes:
    """A map entry is an embedded message: key = field 1, value = field 2."""
    return len_field(field, len_field(1, key) + value)


def timestamp(seconds: int, nanos: int = 0) -> bytes:
    return (int_field(1, seconds) if seconds else b"") + (int_field(2, nanos) if nanos else b"")


def test_varint_helper_matches_the_spec_examples() -> None:
    assert varint(1) == b"\x01"
    assert varint(150) == b"\x96\x01"
    assert varint(300) == b"\xac\x02"
    assert varint(-1) == b"\xff" * 9 + b"\x01"


def test_small_task_message_literal_bytes() -> None:
    # Spelled out byte by byte: 0x0a = field 1 (type) length-delimited, etc.
    golden = b"\x0a\x01x\x12\x02hi\x1a\x02id\x22\x01q\x28\x19"
    msg = TaskMessage.parse(golden)
    assert msg == TaskMessage(type="x", payload=b"hi", id="id", queue="q", retry=25)
    assert bytes(msg) == golden


def test_full_task_message_golden_bytes() -> None:
    golden = b"".join(
        [
            len_field(1, "email:send"),
            len_field(2, b'{"user_id":42}\x00\xff'),
            len_field(3, "7837f142-6337-4217-9276-8f27281b67d1"),
            len_field(4, "critical"),
            int_field(5, 25),
            int_field(6, 3),
            len_field(7, "smtp: connection refused ✉"),
            int_field(8, 1800),
            int_field(9, 1_700_000_000),
            len_field(10, "asynq:{critical}:unique:email:send:abc"),
            int_field(11, 1_699_999_000),
            int_field(12, 86400),
            int_field(13, 1_700_000_100),
            len_field(14, "digest"),
            map_entry(15, "trace-id", len_field(2, "t-1")),
            map_entry(15, "lang", len_field(2, "de")),
        ]
    )
    msg = TaskMessage.parse(golden)
    assert msg.type == "email:send"
    assert msg.payload == b'{"user_id":42}\x00\xff'
    assert msg.id == "7837f142-6337-4217-9276-8f27281b67d1"
    assert msg.queue == "critical"
    assert (msg.retry, msg.retried) == (25, 3)
    assert msg.error_msg == "smtp: connection refused ✉"
    assert (msg.timeout, msg.deadline) == (1800, 1_700_000_000)
    assert msg.unique_key == "asynq:{critical}:unique:email:send:abc"
    assert msg.last_failed_at == 1_699_999_000
    assert (msg.retention, msg.completed_at) == (86400, 1_700_000_100)
    assert msg.group_key == "digest"
    assert msg.headers == {"trace-id": "t-1", "lang": "de"}
    assert bytes(msg) == golden


def test_zero_values_are_not_on_the_wire() -> None:
    assert bytes(TaskMessage()) == b""
    assert bytes(TaskMessage(type="t", retry=0, payload=b"")) == len_field(1, "t")


def test_unknown_fields_survive_a_round_trip() -> None:
    # A newer asynq may add fields; re-encoding (e.g. on retry) must keep them.
    golden = len_field(1, "t") + len_field(99, b"future")
    assert bytes(TaskMessage.parse(golden)) == golden


def test_scheduler_entry_writes_go_zero_time() -> None:
    next_time = datetime(2024, 5, 1, 12, 0, 30, 250_000, tzinfo=UTC)
    entry = SchedulerEntry(
        id="entry-1",
        spec="*/5 * * * *",
        task_type="report",
        task_payload=b"{}",
        enqueue_options=['Queue("reports")', "MaxRetry(3)"],
        next_enqueue_time=next_time,
        prev_enqueue_time=GO_ZERO_TIME,
    )
    golden = b"".join(
        [
            len_field(1, "entry-1"),
            len_field(2, "*/5 * * * *"),
            len_field(3, "report"),
            len_field(4, b"{}"),
            len_field(5, 'Queue("reports")'),
            len_field(5, "MaxRetry(3)"),
            len_field(6, timestamp(int(next_time.timestamp()), 250_000_000)),
            len_field(7, timestamp(-62135596800)),
        ]
    )
    assert bytes(entry) == golden
    assert GO_ZERO_UNIX == -62135596800
    decoded = SchedulerEntry.parse(golden)
    assert decoded.prev_enqueue_time == GO_ZERO_TIME
    assert decoded.next_enqueue_time == next_time
    assert decoded.enqueue_options == ['Queue("reports")', "MaxRetry(3)"]


def test_server_and_worker_info_golden_bytes() -> None:
    start = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    info = ServerInfo(
        host="h",
        pid=77,
        server_id="s",
        concurrency=10,
        queues={"default": 1},
        strict_priority=True,
        status="active",
        start_time=start,
        active_worker_count=2,
    )
    golden = b"".join(
        [
            len_field(1, "h"),
            int_field(2, 77),
            len_field(3, "s"),
            int_field(4, 10),
            map_entry(5, "default", int_field(2, 1)),
            int_field(6, 1),
            len_field(7, "active"),
            len_field(8, timestamp(int(start.timestamp()))),
            int_field(9, 2),
        ]
    )
    assert bytes(info) == golden
    assert ServerInfo.parse(golden) == info
    worker = WorkerInfo(task_id="t", task_payload=b"p", queue="q", deadline=GO_ZERO_TIME)
    wgolden = len_field(4, "t") + len_field(6, b"p") + len_field(7, "q")
    wgolden += len_field(9, timestamp(-62135596800))
    assert bytes(worker) == wgolden
    event = SchedulerEnqueueEvent(task_id="t", enqueue_time=start)
    assert bytes(event) == len_field(1, "t") + len_field(2, timestamp(int(start.timestamp())))


def _generated_tree(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    # betterproto2_compiler pipes its output through `ruff format -`, which reads the ruff
    # config of its working directory: run it where only ruff's defaults apply.
    work = tmp_path / "work"
    work.mkdir()
    (work / "ruff.toml").write_text("")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            f"--python_betterproto2_out={out}",
            str(ROOT / "protos" / "asynq.proto"),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"protoc failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.mark.subprocess
def test_committed_proto_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools is not installed (pip install -e '.[dev]'), cannot regenerate")
    fresh = _files(_generated_tree(tmp_path))
    committed = _files(ROOT / "asyncq" / "proto")
    assert sorted(fresh) == sorted(committed), "generated file set differs; run `nox -s proto`"
    for name, data in fresh.items():
        assert committed[name] == data, f"asyncq/proto/{name} is stale; run `nox -s proto`"
