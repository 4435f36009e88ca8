"""Task ids in the web UI: custom ids whole, uuids cut to 8 characters, always whole on hover
and in links."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from html import unescape
from urllib.parse import unquote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncq import Client, Task
from asyncq.web import create_app
from asyncq.web._pages import short_id


@pytest.fixture
async def http(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(redis_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as h,
    ):
        yield h


async def test_custom_ids_show_whole_and_uuids_short(
    http: httpx.AsyncClient, client: Client
) -> None:
    ids = ["order-1071", "order-1072", "order-1073:eu"]
    for task_id in ids:
        await client.enqueue(Task("order:ship", b"{}"), queue="orders", task_id=task_id)
    plain = await client.enqueue(Task("order:ship", b"{}"), queue="orders")
    html = (await http.get("/queues/orders?state=pending")).text
    cells = re.findall(r'<td class="id"><a href="([^"]+)" title="([^"]+)">([^<]+)</a></td>', html)
    shown = {unescape(title): (unescape(href), unescape(text)) for href, title, text in cells}
    assert set(shown) == {*ids, plain.id}
    for task_id in ids:  # whole: the rows no longer all read "order-10"
        href, text = shown[task_id]
        assert text == task_id
        assert unquote(href).endswith("/tasks/" + task_id)
    href, text = shown[plain.id]
    assert text == plain.id[:8]
    assert href.endswith("/tasks/" + plain.id)


@given(st.uuids())
def test_short_id_cuts_only_uuids(value: uuid.UUID) -> None:
    assert short_id(str(value)) == str(value)[:8]
    assert short_id(str(value).upper()) == str(value).upper()[:8]
    assert short_id(str(value) + "x") == str(value) + "x"


@given(st.text(min_size=1, max_size=60))
def test_short_id_keeps_other_ids_whole(text: str) -> None:
    try:
        uuid_like = str(uuid.UUID(text)) == text.lower()
    except ValueError:
        uuid_like = False
    if not uuid_like:
        assert short_id(text) == text
