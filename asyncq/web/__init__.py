"""The asyncq web UI, JSON API and Prometheus ``/metrics``: ``create_app(...)``.

Needs the ``web`` extra: ``pip install 'asyncq[web]'``. Run it with
``asyncq web`` or mount it in a Starlette/FastAPI app::

    from fastapi import FastAPI
    import asyncq.web

    app = FastAPI()
    app.mount("/asyncq", asyncq.web.create_app("redis://localhost:6379/0"))
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("asyncq.web needs its extra: pip install 'asyncq[web]'") from exc

from asyncq.web._app import create_app
from asyncq.web._security import CSRF_HEADER, Auth

__all__ = ["CSRF_HEADER", "Auth", "create_app"]
