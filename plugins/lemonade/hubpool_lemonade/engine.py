"""Lemonade Server: OpenAI routes under ``/api/v1``, residency and windows from its health."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx

from hubpool_core import OPENAI, Engine, ModelInfo, ProbeResult, ResidentModel, error_message

#: Error texts that are a verdict on the request (spec: "A request no node can serve").
#: Lemonade runs GGUF models on llama-server and relays its messages, so these are
#: llama-server's. First match wins: the at-once verdicts come first, and a template
#: refusal naming a missing user turn is "no-user-query".
REQUEST_ERRORS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (signature, re.compile(pattern, re.IGNORECASE))
    for signature, pattern in (
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
)


class LemonadeEngine(Engine):
    """Lemonade Server at one base URL: ``/api/v1/health`` says what is loaded and at
    which ``ctx_size``, ``/api/v1/models`` lists what is downloaded."""

    kind = "lemonade"
    env_var = "LEMONADE_URL"
    default_url = "http://127.0.0.1:13305"
    dialects = frozenset({OPENAI})
    openai_prefix = "/api/v1"
    has_residency = True

    _product = "Lemonade"

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        """Read the health and the inventory. A loaded model's window is its saved
        ``recipe_options.ctx_size``; a model not loaded states none."""
        try:
            loaded = _loaded(await self._get_json(http, "/api/v1/health"))
            if loaded is None:
                raise _ProbeFailed(True, f"the server at {self.base_url} answered GET /api/v1/health "
                                         f"without Lemonade's fields (is it Lemonade? {self._where()})")
            body = await self._get_json(http, "/api/v1/models")
            data = body.get("data") if isinstance(body, Mapping) else None
            if not isinstance(data, list):
                raise _ProbeFailed(True, f"the server at {self.base_url} answered GET /api/v1/models "
                                         f"without a model list (is it Lemonade? {self._where()})")
            windows = {m.id: m.context_window for m in loaded}
            models = tuple(
                ModelInfo(
                    id=e["id"],
                    context_window=windows.get(e["id"]),
                    owned_by=e.get("owned_by") if isinstance(e.get("owned_by"), str) else None,
                )
                for e in data
                if isinstance(e, Mapping) and isinstance(e.get("id"), str)
            )
            return ProbeResult(running=True, healthy=True, models=models)
        except _ProbeFailed as failed:
            return ProbeResult(running=failed.running, healthy=False, error=failed.error)
        except Exception as exc:  # the contract: a probe never raises, whatever came back
            return ProbeResult(running=True, healthy=False,
                               error=f"could not read the answer of {self.base_url}: {exc!r}")

    async def residency(self, http: httpx.AsyncClient) -> list[ResidentModel] | None:
        """The models ``/api/v1/health`` lists as loaded, each at its ``ctx_size``; ``None``
        when the health cannot be read."""
        try:
            return _loaded(await self._get_json(http, "/api/v1/health"))
        except Exception:  # _ProbeFailed included: a failed read says nothing about memory
            return None

    def request_error(self, status: int, body: Mapping[str, Any]) -> str | None:
        """The signature of a Lemonade error body that is a verdict on the request, else ``None``."""
        message = error_message(body) if isinstance(body, Mapping) else None
        if not message:
            return None
        for signature, pattern in REQUEST_ERRORS:
            if pattern.search(message):
                return signature
        return None

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
