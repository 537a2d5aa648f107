"""Lemonade Server: OpenAI routes under ``/api/v1``, residency and windows from its health."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from hubpool_core import OPENAI, Engine, ModelInfo, ProbeResult, ResidentModel


class LemonadeEngine(Engine):
    """Lemonade Server at one base URL: ``/api/v1/health`` says what is loaded and at
    which ``ctx_size``, ``/api/v1/models`` lists what is downloaded."""

    kind = "lemonade"
    product = "Lemonade"
    env_var = "LEMONADE_URL"
    default_url = "http://127.0.0.1:13305"
    dialects = frozenset({OPENAI})
    openai_prefix = "/api/v1"
    has_residency = True
    owned_by_names = frozenset({"lemonade"})

    #: Error texts that are a verdict on the request (spec: "A request no node can serve").
    #: Lemonade runs GGUF models on llama-server and relays its messages, so these are
    #: llama-server's. First match wins: the at-once verdicts come first, and a template
    #: refusal naming a missing user turn is "no-user-query".
    request_errors = (
        # Qwen3-family templates: "Jinja Exception: No user query found in messages."
        ("no-user-query", r"no user query found in messages"),
        # "'messages' is required", "Expected 'messages' to be an array, got null", "empty messages"
        ("missing-messages", r"'?messages'? (?:is a required property|(?:is|are) required)"),
        ("missing-messages", r"expected 'messages' to be an array|\bempty messages\b"),
        # "request (N tokens) exceeds the available context size (M tokens), try increasing it"
        ("context-length", r"exceeds the available context size"),
        # spec: 2026-09-29, a single Lemonade node answering 500 "Missing 'content' in message"
        ("invalid-message", r"missing '(?:content|role)' in message|expected 'message' to be an object"),
        ("invalid-message", r"missing content part type|invalid 'content' type|expected 'content'"),
        ("invalid-message", r"invalid message format|invalid role"),
        # "Jinja Exception: ...", "Error rendering chat template ..."
        ("chat-template", r"\bjinja\b|\bchat[ _]template\b"),
    )

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        """Read the health and the inventory. A loaded model's window is its saved
        ``recipe_options.ctx_size``; a model not loaded states none."""
        try:
            loaded = _loaded(await self.require_json(http, "/api/v1/health"))
            if loaded is None:
                raise self.wrong_answer("/api/v1/health", "without Lemonade's fields")
            windows = {m.id: m.context_window for m in loaded}
            models = tuple(
                ModelInfo(
                    id=e["id"],
                    context_window=windows.get(e["id"]),
                    owned_by=e.get("owned_by") if isinstance(e.get("owned_by"), str) else None,
                )
                for e in await self.openai_models(http)
            )
            return ProbeResult(running=True, healthy=True, models=models)
        except Exception as exc:  # noqa: BLE001 - the contract: a probe never raises, whatever came back
            return self.probe_failure(exc)

    async def residency(self, http: httpx.AsyncClient) -> list[ResidentModel] | None:
        """The models ``/api/v1/health`` lists as loaded, each at its ``ctx_size``; ``None``
        when the health cannot be read."""
        health = await self.get_json(http, "/api/v1/health")
        return _loaded(health.body) if health.ok else None


def _loaded(health: Any) -> list[ResidentModel] | None:
    """Loaded models from a health body: ``all_models_loaded`` (each with its
    ``recipe_options.ctx_size``), else the single ``model_loaded`` of older builds.
    ``None`` when the body is not Lemonade's health at all."""
    if not isinstance(health, Mapping):
        return None
    entries = health.get("all_models_loaded")
    if isinstance(entries, list):
        loaded = []
        for entry in entries:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("model_name"), str):
                continue
            options = entry.get("recipe_options")
            ctx_size = options.get("ctx_size") if isinstance(options, Mapping) else None
            loaded.append(ResidentModel(id=entry["model_name"], context_window=_positive_int(ctx_size)))
        return loaded
    if "model_loaded" in health:
        name = health["model_loaded"]
        return [ResidentModel(id=name)] if isinstance(name, str) and name else []
    return None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None
