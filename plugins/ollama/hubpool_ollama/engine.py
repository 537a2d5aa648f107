"""Ollama: native and OpenAI dialects, its own Go chat templates, and ``/api/ps`` residency."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx

from hubpool_core import (
    MESSAGES,
    NATIVE,
    OPENAI,
    RESPONSES,
    Engine,
    ModelInfo,
    ProbeResult,
    ResidentModel,
    Timings,
)

_NATIVE_TIMING_KEYS = ("prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration")
#: The first Ollama release serving each agent dialect (its docs: Responses in 0.13.3,
#: stateless; Anthropic Messages in 0.14.0, without /v1/messages/count_tokens; no rerank).
_AGENT_SINCE = ((RESPONSES, (0, 13, 3)), (MESSAGES, (0, 14, 0)))
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


class OllamaEngine(Engine):
    """Ollama at one base URL: ``/api/tags`` is the health check and the inventory,
    ``/api/ps`` the residency; it speaks both dialects and renders its own templates."""

    kind = "ollama"
    product = "Ollama"
    env_var = "OLLAMA_URL"
    default_url = "http://127.0.0.1:11434"
    dialects = frozenset({OPENAI, NATIVE})
    renders_own_template = True
    states_slots = True
    has_residency = True
    # Ollama's /v1/models names library models' owner "library"
    agent_dialects_by = "version"
    owned_by_names = frozenset({"library", "ollama"})

    #: Error texts that are a verdict on the request (spec: "A request no node can serve").
    #: First match wins, so the at-once verdicts come before the ones that wait for a second
    #: candidate, and a template refusal naming a missing user turn is "no-user-query".
    request_errors = (
        # Qwen3-family templates, as Ollama relays them: "no user query found in messages"
        # (spec: 2026-09-26, four nodes answered it to one turn)
        ("no-user-query", r"no user query found in messages"),
        # "messages is required", "'messages' is a required property", "empty messages"
        ("missing-messages", r"'?messages'? (?:is a required property|(?:is|are) required)"),
        ("missing-messages", r"\bempty messages\b"),
        # "the input length exceeds the context length" (/api/embed, truncate off)
        ("context-length", r"input length exceeds the context length"),
        # the /v1 shim: "invalid message format", "invalid message content type: ...", "invalid role"
        ("invalid-message", r"invalid message (?:format|content type)|invalid role"),
        # Go templates: "template: :12:34: executing \"\" at <.Messages>: ..."
        ("chat-template", r"\btemplate: .*\bexecuting\b|\bchat[ _]template\b"),
    )

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        """Read ``/api/tags``. Ollama states no window here (``context_window`` is ``None``)
        and answering ``/api/tags`` is enough to be Ollama (spec: "Ollama answering is Ollama")."""
        try:
            entries = await self._model_list(http, "/api/tags")
            models = tuple(
                ModelInfo(
                    id=_name(e),
                    size=_count(e.get("size")),
                    digest=_text(e.get("digest")),
                    modified_at=_text(e.get("modified_at")),
                    details=e.get("details") if isinstance(e.get("details"), Mapping) else None,
                )
                for e in entries
            )
            return ProbeResult(running=True, healthy=True, models=models)
        except Exception as exc:  # noqa: BLE001 - the contract: a probe never raises, whatever came back
            return self.probe_failure(exc)

    async def agent_dialects(self, http: httpx.AsyncClient) -> frozenset[str] | None:
        """By the version ``/api/version`` reports: Responses from 0.13.3, Messages from
        0.14.0; never ``/v1/messages/count_tokens`` or rerank. ``None`` when the version
        cannot be read or parsed (a build that names no number)."""
        answer = await self.get_json(http, "/api/version")
        version = answer.body.get("version") if answer.ok and isinstance(answer.body, Mapping) else None
        match = _VERSION.match(version) if isinstance(version, str) else None
        if match is None:
            return None
        have = tuple(int(part or 0) for part in match.groups())
        return frozenset(dialect for dialect, since in _AGENT_SINCE if have >= since)

    async def residency(self, http: httpx.AsyncClient) -> list[ResidentModel] | None:
        """Models ``/api/ps`` shows loaded, at the ``context_length`` each was loaded with;
        ``None`` when it cannot be read (never "nothing resident")."""
        try:
            entries = await self._model_list(http, "/api/ps")
            return [
                ResidentModel(id=_name(e), context_window=_count(e.get("context_length")),
                              size_vram=_count(e.get("size_vram")))
                for e in entries
            ]
        except Exception:  # noqa: BLE001 - ProbeFailed included: a failed read says nothing about memory
            return None

    def timings(self, body: Mapping[str, Any]) -> Timings | None:
        """Native counters from a final frame or a non-streamed body (durations are ns);
        an OpenAI-dialect body (``/v1``) falls back to ``usage``."""
        if not isinstance(body, Mapping) or not any(k in body for k in _NATIVE_TIMING_KEYS):
            return super().timings(body)
        timings = Timings(
            prompt_tokens=_count(body.get("prompt_eval_count")),
            # spec: "Cache hits are not reads" -- read when a build reports it, else unknown
            cached_tokens=_count(body.get("prompt_eval_cached_count")),
            prefill_ms=_ns_to_ms(body.get("prompt_eval_duration")),
            decode_tokens=_count(body.get("eval_count")),
            decode_ms=_ns_to_ms(body.get("eval_duration")),
        )
        return None if timings == Timings() else timings

    async def _model_list(self, http: httpx.AsyncClient, path: str) -> list[Mapping[str, Any]]:
        """The named entries of a ``{"models": [...]}`` answer (``null`` is an empty list)."""
        body = await self.require_json(http, path)
        models = body.get("models", ()) if isinstance(body, Mapping) else ()
        if models is None:  # Go writes a nil slice as null: nothing listed
            models = []
        if not isinstance(models, list):
            raise self.wrong_answer(path, "without a model list")
        return [e for e in models if isinstance(e, Mapping) and _name(e)]


def _name(entry: Mapping[str, Any]) -> str:
    for key in ("name", "model"):
        if isinstance(entry.get(key), str) and entry[key]:
            return entry[key]
    return ""


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _ns_to_ms(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return value / 1_000_000
    return None
