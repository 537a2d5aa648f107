"""The agent dialects at the door: their routes, each one's error shape, the checks a body
must pass before it is placed, and the headers that travel with it to the engine.

Errors are in the dialect's own shape, so an SDK shows the reason verbatim: Anthropic's
``{"type": "error", "error": {"type", "message"}}`` for Messages and count_tokens, the
OpenAI error object for Responses and rerank, ``{"error": message}`` for the rest.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from hubpool_core.engine import COUNT_TOKENS, MESSAGES, RERANK, RESPONSES
from hubpool_core.proxy.translate_messages import error_body as anthropic_error
from hubpool_core.proxy.translate_responses import openai_error

#: route -> (dialect, route class)
AGENT_ROUTES = {
    "/v1/messages": (MESSAGES, "chat"),
    "/v1/messages/count_tokens": (COUNT_TOKENS, "count"),
    "/v1/responses": (RESPONSES, "chat"),
    "/v1/rerank": (RERANK, "rerank"),
}
#: other spellings engines accept, and the route each one is
SPELLINGS = {"/v1/reranking": "/v1/rerank", "/rerank": "/v1/rerank"}
#: request headers passed on to the engine (and the peer) as the app sent them
ANTHROPIC_HEADERS = ("anthropic-version", "anthropic-beta")
PASSED_HEADERS = {MESSAGES: ANTHROPIC_HEADERS, COUNT_TOKENS: ANTHROPIC_HEADERS}


def error_body(dialect: str, status: int, message: str, code: str | None = None) -> dict[str, Any]:
    if dialect in (MESSAGES, COUNT_TOKENS):
        return anthropic_error(status, message)
    if dialect in (RESPONSES, RERANK):
        return openai_error(status, message, code)
    return {"error": message}


def error_response(dialect: str, status: int, message: str, code: str | None = None,
                   headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({**error_body(dialect, status, message, code), **extra}, status_code=status, headers=headers)


def reshaped(dialect: str, status: int, body: dict[str, Any]) -> JSONResponse:
    """A refusal built in the OpenAI shape (the inference guard's), in ``dialect``'s."""
    err = body.get("error")
    message = err.get("message") if isinstance(err, dict) else err
    code = err.get("code") if isinstance(err, dict) else None
    return error_response(dialect, status, str(message), code)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _content_ok(content: Any) -> bool:
    return isinstance(content, str) or (isinstance(content, list) and all(isinstance(b, dict) for b in content))


def body_problem(dialect: str, body: dict[str, Any]) -> str | None:
    """Why this body cannot be placed (a 400 in the dialect's shape), or None. Only what no
    engine could serve is refused here; the rest is the engine's to judge."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return '"stream" must be true or false'
    if dialect in (MESSAGES, COUNT_TOKENS):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return '"messages" must be a non-empty array of {"role", "content"} objects'
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant") \
                    or not _content_ok(msg.get("content")):
                return (f'messages[{i}] must be an object with "role" ("user" or "assistant") and "content" '
                        "(a string or an array of content blocks)")
        system = body.get("system")
        if system is not None and not _content_ok(system):
            return '"system" must be a string or an array of text blocks'
        limit = body.get("max_tokens")
        if dialect == MESSAGES and limit is not None and not (_is_int(limit) and limit > 0):
            return '"max_tokens" must be a positive integer'
        if body.get("tools") is not None and not isinstance(body["tools"], list):
            return '"tools" must be an array'
    elif dialect == RESPONSES:
        items = body.get("input")
        if not (isinstance(items, str) or isinstance(items, list)) or not items:
            return '"input" must be a non-empty string or array of input items'
        if isinstance(items, list) and not all(isinstance(i, dict) for i in items):
            return '"input" items must be objects'
        if body.get("instructions") is not None and not isinstance(body["instructions"], str):
            return '"instructions" must be a string'
        previous = body.get("previous_response_id")
        if previous is not None and not (isinstance(previous, str) and 0 < len(previous) <= 200):
            return '"previous_response_id" must be a response id string'
        if body.get("tools") is not None and not isinstance(body["tools"], list):
            return '"tools" must be an array'
    elif dialect == RERANK:
        if not isinstance(body.get("query"), str) or not body["query"]:
            return '"query" must be a non-empty string'
        documents = body.get("documents", body.get("texts"))
        if not isinstance(documents, list) or not documents:
            return '"documents" must be a non-empty array'
        if "top_n" in body and not (_is_int(body["top_n"]) and body["top_n"] > 0):
            return '"top_n" must be a positive integer'
    return None


def passed_headers(dialect: str, headers: Any) -> dict[str, str]:
    """The app's headers that go to the engine with a request in ``dialect`` (ASCII, short)."""
    out = {}
    for name in PASSED_HEADERS.get(dialect, ()):
        value = headers.get(name)
        if isinstance(value, str) and 0 < len(value) <= 512 and value.isascii():
            out[name] = value
    return out
