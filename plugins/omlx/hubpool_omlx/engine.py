"""oMLX: an MLX server for Apple silicon, OpenAI-compatible, on vLLM's default port."""

from __future__ import annotations

import httpx

from hubpool_core import OPENAI, Engine, ProbeResult


class OmlxEngine(Engine):
    """oMLX at one base URL: ``GET /v1/models`` is both the health check and the
    inventory; newer builds state each model's window as ``max_model_len``."""

    kind = "omlx"
    product = "oMLX"
    env_var = "OMLX_URL"
    default_url = "http://127.0.0.1:8000"
    dialects = frozenset({OPENAI})
    # spec: "Two engines on port 8000" -- vLLM and oMLX share the default port, and
    # oMLX's listing says owned_by "omlx".
    owned_by_names = frozenset({"omlx"})
    #: Newer builds state each model's window in its ``/v1/models`` entry.
    listing_window_field = "max_model_len"

    #: Error texts that are a verdict on the request (spec: "A request no node can serve").
    #: First match wins, so the at-once verdicts come before the ones that wait for a second
    #: candidate, and a template refusal naming a missing user turn is "no-user-query".
    #: oMLX renders the model's Jinja template through the tokenizer (jinja2), as vLLM does;
    #: its FastAPI ``{"detail": "..."}`` bodies are read too (``error_message``).
    request_errors = (
        # Qwen3-family templates: raise_exception('No user query found in messages.')
        ("no-user-query", r"no user query found in messages"),
        # "'messages' is a required property", "messages is required", "empty messages"
        ("missing-messages", r"'?messages'? (?:is a required property|(?:is|are) required)"),
        ("missing-messages", r"\bempty messages\b|messages (?:list )?(?:must not|cannot) be empty"),
        # the OpenAI-compatible wording: "This model's maximum context length is N tokens ..."
        ("context-length", r"maximum context length is \d+ tokens"),
        # "The prompt (N tokens) exceeds this model's maximum context length (M tokens)."
        ("context-length", r"exceeds (?:the|this) (?:model's )?(?:maximum )?context (?:length|window|size)"),
        ("invalid-message", r"invalid message format|invalid role"),
        # "jinja2.exceptions.TemplateError: ...", "Error rendering chat template ..."
        ("chat-template", r"jinja2\.exceptions\.|\bchat[ _]template\b"),
    )

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        """Read ``/v1/models``; a server whose models another engine owns is unhealthy."""
        return await self.probe_openai_listing(http)
