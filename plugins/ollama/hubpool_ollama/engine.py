"""Ollama: native and OpenAI dialects, its own Go chat templates, and ``/api/ps`` residency."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx

from hubpool_core import (
    NATIVE,
    OPENAI,
    Engine,
    ModelInfo,
    ProbeResult,
    ResidentModel,
    Timings,
    error_message,
)

#: Error texts that are a verdict on the request (spec: "A request no node can serve").
#: First match wins, so the at-once verdicts come before the ones that wait for a second
#: candidate, and a template refusal naming a missing user turn is "no-user-query".
REQUEST_ERRORS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (signature, re.compile(pattern, re.IGNORECASE))
    for signature, pattern in (
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
)

_NATIVE_TIMING_KEYS = ("prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration")


class OllamaEngine(Engine):
    """Ollama at one base URL: ``/api/tags`` is the health check and the inventory,
    ``/api/ps`` the residency; it speaks both dialects and renders its own templates."""

    kind = "ollama"
    env_var = "OLLAMA_URL"
    default_url = "http://127.0.0.1:11434"
    dialects = frozenset({OPENAI, NATIVE})
    renders_own_template = True
    states_slots = True
    has_residency = True

    _product = "Ollama"

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
        except _ProbeFailed as failed:
            return ProbeResult(running=failed.running, healthy=False, error=failed.error)
        except Exception as exc:  # the contract: a probe never raises, whatever came back
            return ProbeResult(running=True, healthy=False,
                               error=f"could not read the answer of {self.base_url}: {exc!r}")

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
        except Exception:  # _ProbeFailed included: a failed read says nothing about memory
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

    def request_error(self, status: int, body: Mapping[str, Any]) -> str | None:
        """The signature of an Ollama error body that is a verdict on the request, else ``None``."""
        message = error_message(body) if isinstance(body, Mapping) else None
        if not message:
            return None
        for signature, pattern in REQUEST_ERRORS:
            if pattern.search(message):
                return signature
        return None

    async def _model_list(self, http: httpx.AsyncClient, path: str) -> list[Mapping[str, Any]]:
        """The named entries of a ``{"models": [...]}`` answer (``null`` is an empty list)."""
        body = await self._get_json(http, path)
        models = body.get("models", ()) if isinstance(body, Mapping) else ()
        if models is None:  # Go writes a nil slice as null: nothing listed
            models = []
        if not isinstance(models, list):
            raise _ProbeFailed(True, f"the server at {self.base_url} answered GET {path} "
                                     f"without a model list (is it Ollama? {self._where()})")
        return [e for e in models if isinstance(e, Mapping) and _name(e)]

    # -- probing ---------------------------------------------------------------------
    def _where(self) -> str:
        """Where the operator changes the URL, for the end of an error sentence."""
        if self.config.source == self.env_var:
            return f"{self.env_var} points here"
        return f"set {self.env_var}"

    async def _fetch(self, http: httpx.AsyncClient, path: str) -> tuple[int, Any]:
        """(status, parsed JSON or ``_NOT_JSON``); getting no answer at all raises."""
        hint = f"(is {self._product} running? {self._where()})"
        try:
            response = await http.get(self.base_url + path, headers=self.auth_headers())
        except httpx.ConnectTimeout:
            raise _ProbeFailed(False, f"no connection to {self.base_url} within the probe timeout {hint}")
        except httpx.ConnectError:
            raise _ProbeFailed(False, f"connection refused at {self.base_url} {hint}")
        except httpx.TimeoutException:
            raise _ProbeFailed(True, f"{self.base_url} took the connection but did not answer "
                                     f"GET {path} in time")
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            # A protocol or read error means something listened; anything else, nothing did.
            answered = isinstance(exc, (httpx.ProtocolError, httpx.ReadError))
            raise _ProbeFailed(answered, f"GET {self.base_url}{path} failed: {exc or type(exc).__name__}")
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, _NOT_JSON

    async def _get_json(self, http: httpx.AsyncClient, path: str) -> Any:
        """GET ``path`` and return its JSON; anything but a 200 with JSON raises."""
        status, body = await self._fetch(http, path)
        self._require_ok(path, status, body)
        return body

    def _require_ok(self, path: str, status: int, body: Any) -> None:
        """Raise the operator's sentence for an answer that is not a 200 with JSON."""
        if status in (401, 403):
            if self.config.api_key:
                raise _ProbeFailed(True, f"{self._product} at {self.base_url} refused this node's "
                                         f"API key ({status}); check the key this node holds for it")
            raise _ProbeFailed(True, f"{self._product} at {self.base_url} wants an API key "
                                     f"({status}) and this node holds none for it")
        if status != 200:
            detail = error_message(body) if isinstance(body, Mapping) else None
            raise _ProbeFailed(True, f"{self._product} at {self.base_url} answered GET {path} "
                                     f"with {status}" + (f": {detail}" if detail else ""))
        if body is _NOT_JSON:
            raise _ProbeFailed(True, f"the server at {self.base_url} answered GET {path} with "
                                     f"something that is not JSON (is it {self._product}? {self._where()})")


class _ProbeFailed(Exception):
    """A probe step that cannot go on; ``running`` says whether anything answered."""

    def __init__(self, running: bool, error: str) -> None:
        super().__init__(error)
        self.running = running
        self.error = error


_NOT_JSON = object()


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
