"""The five engines the simulator imitates, and how each one words a refusal.

hubpool reads error bodies to tell a verdict on the request from a sick node (spec: "A request
no node can serve"), so the shapes here are the engines' own, trimmed from real responses:

    ollama native   {"error": "<message>"}
    ollama /v1      {"error": {"message", "type", "param": null, "code": null}}   (Ollama's openai shim)
    vllm            {"object": "error", "message", "type", "param": null, "code": N}
    llamacpp        {"error": {"code": N, "message", "type"}}
    lemonade        {"error": {"message", "type"}}
    omlx            {"error": {"message", "type", "code": N}}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Error "type" per status, in each engine's own vocabulary.
_VLLM_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
_LLAMACPP_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
_OPENAI_SHIM_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}


@dataclass(frozen=True)
class Flavor:
    """Which routes an engine serves and how it words errors, listings and refusals."""

    name: str
    default_port: int
    owned_by: str
    openai_prefix: str  # where the OpenAI-compatible routes live
    health_path: str | None
    native: bool  # serves Ollama's /api/* routes
    not_found: str  # message for an unknown model, {model} filled in
    unauthorized: str

    def error_type(self, status: int) -> str:
        if self.name == "vllm":
            return _VLLM_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
        if self.name == "ollama":
            return _OPENAI_SHIM_TYPES.get(status, "api_error")
        return _LLAMACPP_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def error_body(self, status: int, message: str, *, native: bool = False,
                   error_type: str | None = None) -> dict[str, Any]:
        """The body this engine sends with ``status``; ``native`` picks Ollama's /api/* shape."""
        kind = error_type or self.error_type(status)
        if self.name == "ollama":
            if native:
                return {"error": message}
            return {"error": {"message": message, "type": kind, "param": None, "code": None}}
        if self.name == "vllm":
            return {"object": "error", "message": message, "type": kind, "param": None, "code": status}
        if self.name == "llamacpp":
            return {"error": {"code": status, "message": message, "type": kind}}
        if self.name == "lemonade":
            return {"error": {"message": message, "type": kind}}
        return {"error": {"message": message, "type": kind, "code": status}}


FLAVORS: dict[str, Flavor] = {
    "ollama": Flavor(
        "ollama", 11434, "library", "/v1", None, True,
        not_found='model "{model}" not found, try pulling it first', unauthorized="unauthorized",
    ),
    "vllm": Flavor(
        "vllm", 8000, "vllm", "/v1", "/health", False,
        not_found="The model `{model}` does not exist.", unauthorized="Unauthorized",
    ),
    "llamacpp": Flavor(
        "llamacpp", 8080, "llamacpp", "/v1", "/health", False,
        not_found="model '{model}' not found", unauthorized="Invalid API Key",
    ),
    "lemonade": Flavor(
        "lemonade", 13305, "lemonade", "/api/v1", "/api/v1/health", False,
        not_found="model '{model}' not found", unauthorized="Invalid API key",
    ),
    "omlx": Flavor(
        "omlx", 8000, "omlx", "/v1", "/health", False,
        not_found="Model '{model}' not found", unauthorized="Invalid API key",
    ),
}


def context_overflow(
    flavor: Flavor, prompt_tokens: int, completion_tokens: int, window: int
) -> tuple[int, dict[str, Any]] | None:
    """The 400 an engine gives for a prompt longer than its window, or None if it takes it.

    Ollama truncates silently instead (it returns None here); the others refuse, each in its
    own words. vLLM counts the completion budget too, the others only the prompt.
    """
    if flavor.name == "ollama":
        return None
    if flavor.name == "vllm":
        requested = prompt_tokens + completion_tokens
        if requested <= window:
            return None
        message = (
            f"This model's maximum context length is {window} tokens. However, you requested {requested} tokens "
            f"({prompt_tokens} in the messages, {completion_tokens} in the completion). "
            "Please reduce the length of the messages or completion."
        )
        return 400, flavor.error_body(400, message)
    if prompt_tokens <= window:
        return None
    if flavor.name in ("llamacpp", "lemonade"):
        message = (
            f"request ({prompt_tokens} tokens) exceeds the available context size ({window} tokens), try increasing it"
        )
        body = flavor.error_body(400, message, error_type="exceed_context_size_error")
        if flavor.name == "llamacpp":
            body["error"].update({"n_prompt_tokens": prompt_tokens, "n_ctx": window})
        return 400, body
    message = f"The prompt ({prompt_tokens} tokens) exceeds this model's maximum context length ({window} tokens)."
    return 400, flavor.error_body(400, message)
