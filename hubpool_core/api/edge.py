"""What a caller nobody has authenticated yet can make this node read: a body, up to a limit.

Every route a stranger can reach (``/pair/*``, ``GET /capabilities`` — whose signature covers
its body, so the body is read before the peer guard —, ``POST /ui/signin``) reads its body
through :func:`read_capped`: a ``Content-Length`` over the limit is refused before a byte of
the body is read, and a chunked body is read only until it passes the limit. Until issue 26
these routes buffered the whole body and only then answered 413 (256 MiB sent to
``/pair/request`` grew the node by 512 MB). docs/reliability.md, "The edge".
"""

from __future__ import annotations

import re

from starlette.requests import Request

#: a Content-Length the node judges: ASCII digits only (``str.isdigit`` takes ``²``, which
#: ``int`` then refuses), and few enough of them that reading it costs nothing
_LENGTH = re.compile(r"[0-9]{1,20}")


class BodyTooLarge(Exception):
    """The body is larger than the route accepts; ``message`` says so to the caller."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


async def read_capped(request: Request, limit: int) -> bytes:
    """The request body, or BodyTooLarge: refused on a declared length over ``limit`` before
    reading, and, without one (chunked), as soon as the bytes read pass ``limit``. Whatever
    the caller sends after the refusal is never held: the server discards it."""
    # only HTTP's own whitespace around it: str.strip() would also take "\x1d" and the like
    declared = (request.headers.get("content-length") or "").strip(" \t")
    if _LENGTH.fullmatch(declared) and int(declared) > limit:
        raise BodyTooLarge(f"Request body is {declared} bytes; this route accepts at most {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"Request body exceeds the {limit} bytes this route accepts")
        chunks.append(chunk)
    return b"".join(chunks)
