"""The records a worker and a scheduler write (ServerInfo, WorkerInfo, SchedulerEntry,
SchedulerEnqueueEvent) encode as betterproto2 encodes them, without its pydantic import."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncq._codec import Record, encode_record
from asyncq.proto.asynq import SchedulerEnqueueEvent, SchedulerEntry, ServerInfo, WorkerInfo

int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
text = st.text(max_size=30)
# aware datetimes on both sides of the epoch, with and without microseconds
times = st.none() | st.datetimes(
    min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)

records = st.one_of(
    st.builds(
        ServerInfo,
        host=text,
        pid=int32,
        server_id=text,
        concurrency=int32,
        queues=st.dictionaries(text, int32, max_size=4),
        strict_priority=st.booleans(),
        status=text,
        start_time=times,
        active_worker_count=int32,
    ),
    st.builds(
        WorkerInfo,
        host=text,
        pid=int32,
        server_id=text,
        task_id=text,
        task_type=text,
        task_payload=st.binary(max_size=200),
        queue=text,
        start_time=times,
        deadline=times,
    ),
    st.builds(
        SchedulerEntry,
        id=text,
        spec=text,
        task_type=text,
        task_payload=st.binary(max_size=50),
        enqueue_options=st.lists(text, max_size=4),
        next_enqueue_time=times,
        prev_enqueue_time=times,
    ),
    st.builds(SchedulerEnqueueEvent, task_id=text, enqueue_time=times),
)


@given(records)
@settings(max_examples=400, deadline=None)
def test_a_record_encodes_as_betterproto2_and_parses_back(msg: Record) -> None:
    data = encode_record(msg)
    assert type(msg).parse(data) == msg
    if not isinstance(msg, ServerInfo) or all(msg.queues.values()):
        # betterproto2 leaves a map entry's zero value out, protobuf-go (and we) write it
        assert data == bytes(msg)


def test_a_time_in_another_zone_is_written_as_its_utc_instant() -> None:
    east = datetime(2026, 11, 29, 12, 0, 0, 250, tzinfo=UTC).astimezone(
        timezone(timedelta(hours=5, minutes=30))
    )
    event = SchedulerEnqueueEvent(task_id="t", enqueue_time=east)
    assert encode_record(event) == bytes(event)
    assert SchedulerEnqueueEvent.parse(encode_record(event)).enqueue_time == east


def test_a_naive_time_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="timezone aware"):
        encode_record(SchedulerEnqueueEvent(task_id="t", enqueue_time=datetime(2026, 1, 1)))


def test_unknown_fields_of_a_parsed_record_are_written_back() -> None:
    # field 20 (bytes "zz"): what a newer asynq could add to ServerInfo
    data = bytes(ServerInfo(host="h", pid=3)) + b"\xa2\x01\x02zz"
    assert encode_record(ServerInfo.parse(data)) == data


def test_writing_a_heartbeat_record_imports_no_pydantic_dataclasses() -> None:
    # betterproto2's bytes() would: 30-50 ms of a worker's start-up CPU at its first heartbeat
    code = (
        "import sys; from datetime import UTC, datetime; import asyncq\n"
        "from asyncq._codec import encode_record\n"
        "from asyncq.proto.asynq import ServerInfo, WorkerInfo\n"
        "encode_record(ServerInfo(host='h', queues={'q': 1}, start_time=datetime.now(UTC)))\n"
        "encode_record(WorkerInfo(task_id='t', deadline=datetime.now(UTC)))\n"
        "print('pydantic.dataclasses' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
