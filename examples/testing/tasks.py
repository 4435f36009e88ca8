"""A small typed-task module, tested by test_tasks.py with asyncq's pytest plugin."""

from __future__ import annotations

import os

from asyncq import App

app = App(os.environ.get("ASYNCQ_REDIS_URL", "redis://localhost:6379/0"))


@app.task(name="example:double")
async def double(n: int) -> int:
    return 2 * n


@app.task(name="example:shout", max_retry=0)
async def shout(text: str) -> str:
    if not text:
        raise ValueError("nothing to shout")
    return text.upper() + "!"
