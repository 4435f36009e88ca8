"""Errors users read often: each phrase once, and grouped by what failed.

A typed task's bad payload is archived with one sentence, the text the Failures page
groups by; failures on different fields are different groups. A bad ``--rate-limit``
is refused with the option named once.
"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from asyncq import App, Task, TaskFailedError
from asyncq._errsig import MAX_MESSAGE, error_signature, normalise_message
from asyncq._inspection.inspector import Inspector
from asyncq.cli import main
from tests.support.procs import FAST

MISSING_USER = "invalid payload for email:welcome: payload field 'user_id': Field required"
BAD_LANG = "invalid payload for email:welcome: payload field 'lang': Input should be a valid string"


async def test_a_bad_payload_is_one_sentence_grouped_by_its_field(
    app: App[Any], redis: Redis
) -> None:
    payloads = [b'{"lang": "de"}', b'{"lang": "fr"}', b'{"user_id": 7, "lang": 5}']
    infos = [await app.client.enqueue(Task("email:welcome", p)) for p in payloads]
    server = app.server(**FAST)
    await server.start(app.mux)
    try:
        errors = []
        for info in infos:
            with pytest.raises(TaskFailedError) as failed:
                await app.client.wait(info.id, timeout=10)
            errors.append(failed.value.last_error)
    finally:
        await server.shutdown()
    assert errors == [MISSING_USER, MISSING_USER, BAD_LANG]
    async with Inspector(redis) as insp:
        report = await insp.error_groups()
    assert sorted((g.message, g.count) for g in report.groups) == [
        (BAD_LANG, 1),
        (MISSING_USER, 2),
    ]


@pytest.mark.parametrize(
    ("error", "message"),
    [
        # pydantic's location of a list item: the path kept, the index folded
        (
            "invalid payload for t: payload field 'items.3.sku': Field required",
            "invalid payload for t: payload field 'items.<n>.sku': Field required",
        ),
        (
            "AttributeError: 'NoneType' object has no attribute 'total'",
            "'<str>' object has no attribute 'total'",
        ),
        (
            "TypeError: send() missing 1 required positional argument: 'user_id'",
            "send() missing <n> required positional argument: 'user_id'",
        ),
        (
            'TypeError: send() got an unexpected keyword argument "lang"',
            'send() got an unexpected keyword argument "lang"',
        ),
        # values stay folded: not a name, or not labelled as one
        ("ValueError: field 'a b' is bad", "field '<str>' is bad"),
        ("ValueError: field '42' is bad", "field '<str>' is bad"),
        ("ValueError: subfield 'x' is bad", "subfield '<str>' is bad"),
        ("KeyError: 'user_id'", "'<str>'"),
    ],
)
def test_labelled_names_are_kept_and_values_folded(error: str, message: str) -> None:
    sig = error_signature(error)
    assert sig.message == message
    assert normalise_message(sig.message) == sig.message


def test_a_name_that_would_be_cut_short_is_left_out() -> None:
    # The 240-character cut never splits a kept name: normalised again, a cut name
    # ("field 'deadbeef12" without its quote) would fold into <hex>.
    message = "x" * 220 + " field 'deadbeef12345678abcdef' is bad"
    once = normalise_message(message)
    assert once == "x" * 220 + " field"
    assert normalise_message(once) == once


# Words that make labels, names, near-names and the folded kinds meet. Quotes come in
# pairs and words are apart: a quote or id run into the word before it is folded
# differently once that word is (the folding's limit, with or without kept names).
_WORDS = st.sampled_from([
    "field", "argument:", "option", "xfield", "'a'", "'items.3.sku'", '"x_9"', "'3'",
    "'a b'", "'deadbeef12'", "'items.<n>'", "a", "items.3", "_9", "deadbeef12",
    "0x1f", "-", ":", "[::1]:80", "<n>", "'<str>'", "x" * 60,
])  # fmt: skip


@settings(deadline=None)  # a busy machine must not fail a pure function
@given(st.lists(_WORDS, max_size=30).map(" ".join))
def test_normalising_with_kept_names_is_idempotent_and_bounded(text: str) -> None:
    once = normalise_message(text)
    assert normalise_message(once) == once
    assert len(once) <= MAX_MESSAGE
    assert once == once.strip()


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("--rate-limit", "email=abc", "queue 'email': "),
        ("--type-rate-limit", "email:welcome=0/s", "task type 'email:welcome': "),
    ],
)
def test_a_bad_rate_names_its_option_once(option: str, value: str, problem: str) -> None:
    # The rates are read before the app is imported: nothing is started.
    result = CliRunner().invoke(main, ["worker", "nosuch:app", option, value])
    assert result.exit_code != 0
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: Invalid value for {option}: {problem}"), line
    assert line.count(option) == 1, line
