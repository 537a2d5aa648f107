"""The web UI: a landing page without a key, sign-in with the operator key, the home and
pool pages, and the setup guide. Pages are server-rendered shells; their data comes from the
node's own operator JSON routes, read by a little JavaScript with the session cookie.

- ``routes.py``: the UI's own routes; only the landing and sign-in pages answer without a
  session.
- ``setting_words.py``: every pool setting's label and help, as the settings form shows them.
- ``templates/``: the Jinja2 page shells; ``static/``: their CSS and plain JavaScript.
"""

from __future__ import annotations

from fastapi import FastAPI

from hubpool_core.web.routes import STATIC_DIR, build_router


def mount(app: FastAPI) -> None:
    """Add the UI's routes and its static files to the node's app."""
    from starlette.staticfiles import StaticFiles

    app.include_router(build_router())
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
