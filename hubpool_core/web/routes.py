"""Routes of the web UI. Only the landing and sign-in pages answer without a session."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from hubpool_core import __version__
from hubpool_core.access.guards import operator_refusal, source_ip, trusts_proxy
from hubpool_core.access.sessions import CSRF_FIELD, SESSION_SECONDS, Session, cookie_header, csrf_ok, store_for
from hubpool_core.api import operator
from hubpool_core.api.edge import BodyTooLarge, read_capped
from hubpool_core.config import NOT_PATCHABLE, PREFERENCE_KEYS, PoolSettings, describe_range
from hubpool_core.telemetry.annotations import annotations as row_notes
from hubpool_core.telemetry.charts import WINDOWS, chart_series, window_bounds
from hubpool_core.web.setting_words import SETTING_WORDS

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
P = "/api/inference/pool"
#: the largest form a page posts (the sign-in form holds one key): anything larger is refused
#: before it is read, because /ui/signin answers anyone
MAX_FORM_BYTES = 8192
TOO_LARGE = f"That form is larger than this page sends (at most {MAX_FORM_BYTES} bytes)."
#: headers a reverse proxy sets: shown on the landing page so the operator can see what
#: the proxy claimed, never used to build a URL or decide anything
FORWARDED = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port",
             "x-forwarded-prefix", "x-real-ip")
#: the security headers every UI page carries; the pages load only their own scripts and styles
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

@functools.cache
def _templates() -> Any:
    """The template environment, built on the first page: jinja2 costs a node that never
    serves a page about 3 MB of resident memory (performance goal G7)."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    return Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                       trim_blocks=True, lstrip_blocks=True)


def _page(name: str, status: int = 200, headers: dict[str, str] | None = None, **context: Any) -> HTMLResponse:
    html = _templates().get_template(name).render(version=__version__, **context)
    return HTMLResponse(html, status_code=status, headers={**PAGE_HEADERS, **(headers or {})})


def _session(request: Request) -> Session | None:
    return store_for(request.app.state.node.keys).from_headers(dict(request.headers.items()))


def _to_signin() -> RedirectResponse:
    return RedirectResponse("/ui/signin", status_code=303, headers={"Cache-Control": "no-store"})


def base_urls(request: Request) -> dict[str, str]:
    """Client base URLs built from the address the browser used (its Host header and the
    scheme this node was reached with), never from a forwarded header."""
    scheme = request.url.scheme
    if "x-forwarded-proto" in request.headers or "forwarded" in request.headers:
        # uvicorn rewrites the scheme from these for a loopback caller; the node itself speaks
        # plain HTTP, so that is what a direct visit used (the page's script then shows the
        # browser's own location.origin, which is right behind `tailscale serve` too)
        scheme = "http"
    host = request.headers.get("host") or f"{request.url.hostname}:{request.url.port}"
    origin = f"{scheme}://{host}"
    return {"origin": origin, "openai": origin + "/v1", "native": origin}  # native: the Ollama dialect


async def landing(request: Request) -> Response:
    """What this is and how to connect a client. No data: no model, node name or count."""
    forwarded = [(name, request.headers[name]) for name in FORWARDED if name in request.headers]
    return _page("landing.html", urls=base_urls(request), forwarded=forwarded,
                 signed_in=_session(request) is not None)


async def signin_form(request: Request) -> Response:
    if _session(request) is not None:
        return RedirectResponse("/ui", status_code=303)
    return _page("signin.html", error=None)


async def _form(request: Request) -> dict[str, str] | None:
    """The posted form's fields, or None when the body is larger than any form of these pages
    (refused on its Content-Length before reading, or as soon as a chunked body passes it)."""
    try:
        raw = await read_capped(request, MAX_FORM_BYTES)
    except BodyTooLarge:
        return None
    try:
        parsed = parse_qs(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=10)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v[0] for k, v in parsed.items() if v}


async def signin(request: Request) -> Response:
    """Trade the operator key for a session cookie; the key itself is never stored in the browser."""
    node = request.app.state.node
    keys = node.keys
    store = store_for(keys)
    # the limit is per source (spec "What a source means"): one caller guessing must not lock
    # the operator at another address out; callers behind an untrusted proxy share one count
    source = source_ip(request.client.host if request.client else None, request.headers,
                       trusts_proxy(node.env.trust_proxy))
    if not store.sign_in_allowed(source):
        return _page("signin.html", status=429, headers={"Retry-After": "60"},
                     error="Too many wrong keys from this address in the last minute. Wait a minute, then try "
                           "again.")
    form = await _form(request)
    if form is None:
        return _page("signin.html", status=413, error=TOO_LARGE)
    key = (form.get("key") or "").strip()
    principal = keys.resolve(key) if key else None
    if principal is None or principal.scope != "operator":
        if key:
            store.failed_sign_in(source)
        message = ("Enter the operator key." if not key else
                   "That is not an operator key of this node. It is in operator.key in the node's data directory.")
        return _page("signin.html", status=401, error=message)
    session = store.create()
    response = RedirectResponse("/ui", status_code=303)
    response.headers["Set-Cookie"] = cookie_header(store.cookie_name, session.sid,
                                                   secure=request.url.scheme == "https", max_age=SESSION_SECONDS)
    response.headers["Cache-Control"] = "no-store"
    return response


async def signout(request: Request) -> Response:
    """End this browser's session. The form carries the CSRF token, so another site cannot sign you out."""
    store = store_for(request.app.state.node.keys)
    session = _session(request)
    if session is not None:
        form = await _form(request)
        if form is None:
            return JSONResponse({"error": TOO_LARGE}, status_code=413)
        if not csrf_ok(session, form.get(CSRF_FIELD) or request.headers.get("x-csrf-token")):
            return JSONResponse({"error": "Sign-out needs the page's CSRF token; reload the page and try again",
                                 "code": "AUTH_ERROR_CSRF"}, status_code=403)
        store.destroy(session.sid)
    response = RedirectResponse("/", status_code=303)
    response.headers["Set-Cookie"] = cookie_header(store.cookie_name, "", secure=request.url.scheme == "https",
                                                   max_age=0)
    return response


def settings_schema() -> list[dict[str, Any]]:
    """Every pool setting the page can change, with its range as the node enforces it."""
    out = []
    for key, field in PoolSettings.model_fields.items():
        if key in ("poolPins", "pluginsDisabled"):
            continue
        lo = hi = None
        for meta in field.metadata:
            lo = getattr(meta, "ge", lo)
            hi = getattr(meta, "le", hi)
        origin = getattr(field.annotation, "__origin__", None)
        kind = "bool" if field.annotation is bool else "text" if key == "inferenceModel" else \
            "map" if origin is dict else "list" if origin is list else "int"
        label, words = SETTING_WORDS.get(key, (key, ""))
        out.append({"key": key, "label": label, "words": words,
                    "kind": kind, "min": lo, "max": hi, "nullable": field.default is None,
                    "range": describe_range(key) if kind != "text" else "a model id, or empty for none",
                    "via": "preferences" if key in PREFERENCE_KEYS else "settings",
                    "patchable": key not in NOT_PATCHABLE or key in PREFERENCE_KEYS,
                    "help": field.description or ""})
    return out


def _signed_in_page(name: str, request: Request, **context: Any) -> Response:
    session = _session(request)
    if session is None:
        return _to_signin()
    return _page(name, csrf=session.csrf, **context)


async def home(request: Request) -> Response:
    return _signed_in_page("home.html", request, active="home")


async def pool_page(request: Request) -> Response:
    return _signed_in_page("pool.html", request, active="pool",
                           schema=json.dumps(settings_schema()).replace("<", "\\u003c"))


async def routing_log_with_notes(request: Request) -> Response:
    """The operator routing-log answer, each entry with the ↳ notes `hubpool log` prints.

    The notes are the ones `hubpool log` prints, so the page and the terminal say the same thing."""
    answer = await operator.routing_log(request)
    if answer.status_code != 200:
        return answer
    data = json.loads(cast(bytes, answer.body))  # a JSONResponse's body is bytes, never a memoryview
    for entry in data.get("entries") or []:
        entry["notes"] = row_notes(entry)
    return JSONResponse(data)


async def routing_log_charts(request: Request) -> Response:
    """The Hub Pool page's charts: per-minute series folded from routing-log rows.

    ``window=hour`` (the default) reads the in-memory ring. ``window=day``, or ``source=history``,
    reads the persisted routing history (``node.history_store``, on with HUB_POOL_HISTORY), whose
    ``rows_since(datetime)`` answers rows in the ring's wire shape. With the history off the
    answer is 409 saying how to turn it on; the page then offers the last hour only."""
    node = request.app.state.node
    refused = operator_refusal(request.method, request.url.path, dict(request.headers.items()), node.keys)
    if isinstance(refused, tuple):
        return JSONResponse(refused[1], status_code=refused[0])
    window = request.query_params.get("window", "hour")
    if window not in WINDOWS:
        return JSONResponse({"error": f"window must be one of {', '.join(WINDOWS)}"}, status_code=400)
    source = request.query_params.get("source", "ring" if window == "hour" else "history")
    if source not in ("ring", "history"):
        return JSONResponse({"error": "source must be ring or history"}, status_code=400)
    now = time.time()
    history = getattr(node, "history_store", None)
    if source == "history":
        if history is None:
            return JSONResponse({"error": "the routing history is off on this node, so only the last hour (from "
                                          "the in-memory routing log) can be charted; turn it on with "
                                          "HUB_POOL_HISTORY", "historyAvailable": False}, status_code=409)
        since = datetime.fromtimestamp(window_bounds(now, window)[0], UTC)
        try:  # a day of rows is a real query: off the event loop
            rows = await asyncio.to_thread(history.rows_since, since)
        except Exception as exc:  # noqa: BLE001 - a down history database is the operator's to see, not a 500
            return JSONResponse({"error": f"the routing history could not be read ({type(exc).__name__}); the "
                                          "last hour from the in-memory routing log still charts",
                                 "historyAvailable": True}, status_code=503)
    else:
        rows = node.routing_log.entries()
    data = chart_series(rows, now, window)
    log = node.routing_log
    data.update(source=source, historyAvailable=history is not None,
                # the ring holds the whole window unless it has already let rows go
                complete=source == "history" or log.total_recorded <= log.capacity or data["reachesBack"],
                capacity=log.capacity)
    return JSONResponse(data)


def build_router() -> APIRouter:
    """The UI's own routes (the operator JSON routes it reads live in hubpool_core.api)."""
    r = APIRouter()
    r.add_api_route("/", landing, methods=["GET"], include_in_schema=False)
    r.add_api_route("/ui/signin", signin_form, methods=["GET"], include_in_schema=False)
    r.add_api_route("/ui/signin", signin, methods=["POST"], include_in_schema=False)
    r.add_api_route("/ui/signout", signout, methods=["POST"], include_in_schema=False)
    r.add_api_route("/ui", home, methods=["GET"], include_in_schema=False)
    r.add_api_route("/ui/pool", pool_page, methods=["GET"], include_in_schema=False)
    r.add_api_route(P + "/routing-log/annotated", routing_log_with_notes, methods=["GET"], include_in_schema=False)
    r.add_api_route(P + "/routing-log/charts", routing_log_charts, methods=["GET"], include_in_schema=False)
    return r
