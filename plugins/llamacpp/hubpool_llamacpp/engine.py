"""llama.cpp's llama-server: one model, the window and slot count it was started with."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx

from hubpool_core import (
    OPENAI,
    Engine,
    ModelInfo,
    ProbeResult,
    ResidentModel,
    Timings,
    error_message,
)

#: ``owned_by`` values that name an engine other than llama-server, and how to say them.
OTHER_ENGINES = {
    "vllm": "vLLM",
    "omlx": "oMLX",
    "lemonade": "Lemonade",
    "library": "Ollama",  # Ollama's /v1/models names library models' owner "library"
    "ollama": "Ollama",
}

#: Error texts that are a verdict on the request (spec: "A request no node can serve").
#: First match wins, so the at-once verdicts come before the ones that wait for a second
#: candidate, and a template refusal naming a missing user turn is "no-user-query".
REQUEST_ERRORS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (signature, re.compile(pattern, re.IGNORECASE))
    for signature, pattern in (
        # Qwen3-family templates through --jinja: "Jinja Exception: No user query found in messages."
        ("no-user-query", r"no user query found in messages"),
        # "'messages' is required", "Expected 'messages' to be an array, got null", "empty messages"
        ("missing-messages", r"'?messages'? (?:is a required property|(?:is|are) required)"),
        ("missing-messages", r"expected 'messages' to be an array|\bempty messages\b"),
        # "request (41022 tokens) exceeds the available context size (32768 tokens), try increasing it"
        ("context-length", r"exceeds the available context size"),
        # common_chat_msgs_parse_oaicompat: "Missing 'content' in message", "Missing 'role' in
        # message: {...}", "Expected 'message' to be an object", "Missing content part type: ..."
        ("invalid-message", r"missing '(?:content|role)' in message|expected 'message' to be an object"),
        ("invalid-message", r"missing content part type|invalid 'content' type|expected 'content'"),
        ("invalid-message", r"invalid message format|invalid role"),
        # minja: "Jinja Exception: ...", "Error rendering chat template ..."
        ("chat-template", r"\bjinja\b|\bchat[ _]template\b"),
    )
)


class LlamacppEngine(Engine):
    """llama-server at one base URL: ``/health`` says whether the model is loaded,
    ``/v1/models`` names it, ``/props`` states its window (``n_ctx``) and ``total_slots``."""

    kind = "llamacpp"
    env_var = "LLAMACPP_URL"
    default_url = "http://127.0.0.1:8080"
    dialects = frozenset({OPENAI})
    states_slots = True

    _product = "llama-server"

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        """Check ``/health``, list ``/v1/models``, then read the window and slots from
        ``/props`` (a build without ``/props`` falls back to the trained window)."""
        try:
            status, body = await self._fetch(http, "/health")
            if status == 503:
                # "Loading model" (503 unavailable_error) until the weights are in memory;
                # older builds answered {"status": "loading model"}.
                detail = (error_message(body) or body.get("status")) if isinstance(body, Mapping) else None
                if isinstance(detail, str) and "loading" in detail.lower():
                    error = f"llama-server at {self.base_url} is loading model"
                else:
                    error = f"llama-server at {self.base_url} is unavailable (503: {detail or 'no reason given'})"
                return ProbeResult(running=True, healthy=False, error=error)
            if status != 200:
                self._require_ok("/health", status, body)
            body = await self._get_json(http, "/v1/models")
            data = body.get("data") if isinstance(body, Mapping) else None
            if not isinstance(data, list):
                raise _ProbeFailed(True, f"the server at {self.base_url} answered GET /v1/models "
                                         f"without a model list (is it llama-server? {self._where()})")
            entries = [e for e in data if isinstance(e, Mapping) and isinstance(e.get("id"), str)]
            other = _other_engine(entries, own=self.kind)
            if other:
                return ProbeResult(running=True, healthy=False,
                                   error=f"the server at {self.base_url} is {other}, not llama-server "
                                         f"(point {self.env_var} at llama-server)")
            n_ctx, slots = await self._props(http)
            models = tuple(
                ModelInfo(
                    id=e["id"],
                    context_window=n_ctx or _positive_int(_meta(e).get("n_ctx_train")),
                    size=_positive_int(_meta(e).get("size")),
                    owned_by=e.get("owned_by") if isinstance(e.get("owned_by"), str) else None,
                )
                for e in entries
            )
            return ProbeResult(running=True, healthy=True, models=models, slots=slots)
        except _ProbeFailed as failed:
            return ProbeResult(running=failed.running, healthy=False, error=failed.error)
        except Exception as exc:  # the contract: a probe never raises, whatever came back
            return ProbeResult(running=True, healthy=False,
                               error=f"could not read the answer of {self.base_url}: {exc!r}")

    async def residency(self, http: httpx.AsyncClient) -> list[ResidentModel] | None:
        """llama-server holds the model it was started with, at its window, for as long as
        it answers; ``None`` when it cannot be read."""
        result = await self.probe(http)
        if not result.healthy:
            return None
        return [ResidentModel(id=m.id, context_window=m.context_window) for m in result.models]

    def timings(self, body: Mapping[str, Any]) -> Timings | None:
        """llama-server's own ``timings`` (``prompt_n`` counts only the tokens read, so the
        whole prompt is ``prompt_n + cache_n``), with ``usage`` filling what it lacks."""
        usage = super().timings(body)
        native = body.get("timings") if isinstance(body, Mapping) else None
        if not isinstance(native, Mapping):
            return usage
        read, cached = _count(native.get("prompt_n")), _count(native.get("cache_n"))
        decoded = _count(native.get("predicted_n"))
        fallback = usage or Timings()
        if read is not None and cached is not None:
            whole = read + cached
        else:  # a build without cache_n: only usage can say how long the prompt was
            whole = fallback.prompt_tokens if fallback.prompt_tokens is not None else read
        timings = Timings(
            prompt_tokens=whole,
            cached_tokens=cached if cached is not None else fallback.cached_tokens,
            prefill_ms=_ms(native.get("prompt_ms")),
            decode_tokens=decoded if decoded is not None else fallback.decode_tokens,
            decode_ms=_ms(native.get("predicted_ms")),
        )
        return None if timings == Timings() else timings

    def request_error(self, status: int, body: Mapping[str, Any]) -> str | None:
        """The signature of a llama-server error body that is a verdict on the request,
        else ``None``."""
        message = error_message(body) if isinstance(body, Mapping) else None
        if not message:
            return None
        for signature, pattern in REQUEST_ERRORS:
            if pattern.search(message):
                return signature
        return None

    async def _props(self, http: httpx.AsyncClient) -> tuple[int | None, int | None]:
        """(per-slot window, slot count) from ``/props``; (None, None) when unreadable."""
        try:
            body = await self._get_json(http, "/props")
        except _ProbeFailed:
            return None, None
        if not isinstance(body, Mapping):
            return None, None
        settings = body.get("default_generation_settings")
        n_ctx = _positive_int(settings.get("n_ctx")) if isinstance(settings, Mapping) else None
        return n_ctx, _positive_int(body.get("total_slots"))

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


def _other_engine(entries: list[Mapping[str, Any]], own: str) -> str | None:
    """The engine the models name, when they name another one; ``None`` when they name
    this engine or no engine at all (generic owners such as ``organization-owner``)."""
    owners = {str(e.get("owned_by") or "").strip().lower() for e in entries}
    if own in owners:
        return None
    for owner in sorted(owners):
        if owner in OTHER_ENGINES:
            return OTHER_ENGINES[owner]
    return None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _meta(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = entry.get("meta")
    return meta if isinstance(meta, Mapping) else {}


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _ms(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None
