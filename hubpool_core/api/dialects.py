"""The agent dialects at the door: their routes, each one's error shape, and the headers that
travel with a request to the engine.

The door refuses only a body no engine could serve (not JSON, not an object, no model: see
``api/inference.py``); everything else is the engine's to judge, because an agent's real
requests carry far more than an SDK's clean ones (a ``system`` message inside ``messages``,
betas, adaptive thinking, hosted tools), and an engine that serves the dialect natively
answers them (docs/translation.md).

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


def passed_headers(dialect: str, headers: Any) -> dict[str, str]:
    """The app's headers that go to the engine with a request in ``dialect``, verbatim
    whatever their length (Claude Code's ``anthropic-beta`` lists seven to ten betas and
    changes between turns); the server's own header limit already bounds them."""
    out = {}
    for name in PASSED_HEADERS.get(dialect, ()):
        value = headers.get(name)
        if isinstance(value, str) and value and value.isascii():
            out[name] = value
    return out
