"""oMLX: an MLX server for Apple silicon, OpenAI-compatible, on vLLM's default port."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx

from hubpool_core import OPENAI, Engine, ModelInfo, ProbeResult, error_message

#: ``owned_by`` values that name an engine other than oMLX, and how to say them.
#: spec: "Two engines on port 8000" -- vLLM and oMLX share the default port.
OTHER_ENGINES = {
    "vllm": "vLLM",
    "llamacpp": "llama-server",
    "lemonade": "Lemonade",
    "library": "Ollama",  # Ollama's /v1/models names library models' owner "library"
    "ollama": "Ollama",
}

#: Error texts that are a verdict on the request (spec: "A request no node can serve").
#: First match wins, so the at-once verdicts come before the ones that wait for a second
#: candidate, and a template refusal naming a missing user turn is "no-user-query".
#: oMLX renders the model's Jinja template through the tokenizer (jinja2), as vLLM does.
REQUEST_ERRORS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (signature, re.compile(pattern, re.IGNORECASE))
    for signature, pattern in (
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
)


class OmlxEngine(Engine):
    """oMLX at one base URL: ``GET /v1/models`` is both the health check and the
    inventory; newer builds state each model's window as ``max_model_len``."""

    kind = "omlx"
    env_var = "OMLX_URL"
    default_url = "http://127.0.0.1:8000"
    dialects = frozenset({OPENAI})

    _product = "oMLX"

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        """Read ``/v1/models``; a server whose models another engine owns is unhealthy."""
        try:
            body = await self._get_json(http, "/v1/models")
            data = body.get("data") if isinstance(body, Mapping) else None
            if not isinstance(data, list):
                raise _ProbeFailed(True, f"the server at {self.base_url} answered GET /v1/models "
                                         f"without a model list (is it oMLX? {self._where()})")
            entries = [e for e in data if isinstance(e, Mapping) and isinstance(e.get("id"), str)]
            other = _other_engine(entries, own=self.kind)
            if other:
                shared = "vLLM and oMLX both default to port 8000; " if other == "vLLM" else ""
                return ProbeResult(
                    running=True, healthy=False,
                    error=f"the server at {self.base_url} is {other}, not oMLX "
                          f"({shared}point {self.env_var} at oMLX)",
                )
            models = tuple(
                ModelInfo(
                    id=e["id"],
                    context_window=_positive_int(e.get("max_model_len")),
                    owned_by=e.get("owned_by") if isinstance(e.get("owned_by"), str) else None,
                )
                for e in entries
            )
            return ProbeResult(running=True, healthy=True, models=models)
        except _ProbeFailed as failed:
            return ProbeResult(running=failed.running, healthy=False, error=failed.error)
        except Exception as exc:  # the contract: a probe never raises, whatever came back
            return ProbeResult(running=True, healthy=False,
                               error=f"could not read the answer of {self.base_url}: {exc!r}")

    def request_error(self, status: int, body: Mapping[str, Any]) -> str | None:
        """The signature of an oMLX error body that is a verdict on the request, else ``None``."""
        message = error_message(body) if isinstance(body, Mapping) else None
        if message is None and isinstance(body, Mapping) and isinstance(body.get("detail"), str):
            message = body["detail"]  # FastAPI's own shape for an HTTPException
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
