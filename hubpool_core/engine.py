"""The engine contract: what the core may ask of an inference engine.

An engine plugin registers one :class:`Engine` subclass per kind of engine
(see ``hubpool_register_engines`` in :mod:`hubpool_core.hookspecs`). The core makes
one instance per configured base URL and calls its methods directly; nothing on the
request path goes through a pluggy hook call.

Two dialects exist on the wire, and the core knows both as protocols, never as
products:

``"openai"``
    The OpenAI-compatible HTTP API: ``/v1/chat/completions``, ``/v1/completions``,
    ``/v1/embeddings``, ``/v1/models``; streams are Server-Sent Events ending in
    ``data: [DONE]``.
``"native"``
    The NDJSON dialect of ``/api/chat``, ``/api/generate``, ``/api/embed``,
    ``/api/embeddings``, ``/api/tags``, ``/api/ps``, ``/api/show`` and
    ``/api/version``; a stream's last line carries ``"done": true``.

The core asks what an engine *can do* (``dialects``, ``renders_own_template``,
``states_slots``), never what it *is*: ``kind`` is a label for headers and logs.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

OPENAI = "openai"
NATIVE = "native"

#: Signatures of a 500 body that is a verdict on the request rather than on the node
#: (spec: "A request no node can serve"). Never the engine's message itself.
REQUEST_ERROR_SIGNATURES = (
    "no-user-query",
    "missing-messages",
    "invalid-message",
    "context-length",
    "chat-template",
)


@dataclass(frozen=True)
class ModelInfo:
    """One model an engine lists.

    ``id`` is the model id exactly as the engine spells it. ``context_window`` is the
    window the engine states it runs the model at, or ``None`` when the engine does
    not say (``None`` never means "unlimited"). ``size``, ``digest``, ``modified_at``
    and ``details`` are passed through to native listings when the engine has them;
    ``None`` means unknown, and listings emit them empty rather than inventing them.
    """

    id: str
    context_window: int | None = None
    size: int | None = None
    digest: str | None = None
    modified_at: str | None = None
    details: Mapping[str, Any] | None = None
    owned_by: str | None = None


@dataclass(frozen=True)
class ProbeResult:
    """The answer of one health probe.

    ``running`` says something answered at the base URL; ``healthy`` says it is this
    kind of engine and ready to serve. A server that names another engine (two engines
    default to port 8000) is ``running=True, healthy=False`` with ``error`` saying so.
    ``models`` is the on-disk inventory (empty when unhealthy). ``error`` is a short
    operator-facing sentence, or ``None`` when healthy. ``slots`` is the number of
    requests the engine says it runs at once, or ``None`` when it does not say.
    """

    running: bool
    healthy: bool
    models: tuple[ModelInfo, ...] = ()
    error: str | None = None
    slots: int | None = None


@dataclass(frozen=True)
class ResidentModel:
    """A model the engine holds in memory now. ``context_window`` is the window it is
    loaded at, or ``None`` when the engine does not say."""

    id: str
    context_window: int | None = None
    size_vram: int | None = None


@dataclass(frozen=True)
class Timings:
    """What a finished response says about the work it took.

    Every field is ``None`` when the engine did not report it; ``None`` is "unknown",
    never zero. ``prompt_tokens`` counts the whole prompt, ``cached_tokens`` the part
    served from the engine's prompt cache, ``prefill_ms`` the time spent reading the
    prompt, ``decode_tokens``/``decode_ms`` the generation.
    """

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    prefill_ms: float | None = None
    decode_tokens: int | None = None
    decode_ms: float | None = None


@dataclass
class EngineConfig:
    """How one engine instance is reached: its base URL and, for engines started with
    a key, the key to present. ``source`` names where the URL came from (an
    environment variable, or ``default``)."""

    base_url: str
    api_key: str | None = None
    source: str = "default"
    extra: dict[str, Any] = field(default_factory=dict)


class Engine(ABC):
    """One inference engine at one base URL.

    Subclasses set the class attributes and implement :meth:`probe`; every other method
    has a default that is correct for an engine that reports nothing beyond the
    dialect's basics. Methods never raise for an engine that is down or answers
    nonsense: they return ``None`` or an unhealthy :class:`ProbeResult`.
    """

    #: Short lower-case label, sent as ``X-Hub-Pool-Backend`` and printed in logs.
    kind: ClassVar[str]
    #: Environment variable naming the base URL (for example ``VLLM_URL``).
    env_var: ClassVar[str]
    #: Base URL used when the variable is unset.
    default_url: ClassVar[str]
    #: Dialects the engine answers natively; a request in another is translated.
    dialects: ClassVar[frozenset[str]] = frozenset({OPENAI})
    #: Path prefix of the OpenAI-compatible routes on this engine.
    openai_prefix: ClassVar[str] = "/v1"
    #: True when the engine renders its own chat template, so a template refusal from
    #: another engine says nothing about this one.
    renders_own_template: ClassVar[bool] = False
    #: True when an operator's slot statement (``ollamaSlots``) describes this engine.
    states_slots: ClassVar[bool] = False
    #: True when the engine can tell what it holds in memory (:meth:`residency`).
    has_residency: ClassVar[bool] = False

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")

    # -- reaching the engine -------------------------------------------------------
    def auth_headers(self) -> dict[str, str]:
        """Headers that authenticate this node to the engine; empty when it needs none."""
        if self.config.api_key:
            return {"Authorization": f"Bearer {self.config.api_key}"}
        return {}

    def upstream_path(self, dialect: str, route: str) -> str:
        """The engine's path for an app-facing ``route`` in ``dialect``.

        ``route`` is the app-facing path (``/v1/chat/completions``, ``/api/chat``).
        OpenAI routes are re-rooted under :attr:`openai_prefix`; native routes pass
        through unchanged.
        """
        if dialect == OPENAI and route.startswith("/v1/"):
            return self.openai_prefix + route[len("/v1"):]
        return route

    # -- health and inventory ------------------------------------------------------
    @abstractmethod
    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        """Check the engine and read its model inventory in one pass.

        Must answer within the client's timeout and never raise: a refused connection
        is ``ProbeResult(running=False, healthy=False, error=...)``.
        """

    async def residency(self, http: httpx.AsyncClient) -> list[ResidentModel] | None:
        """Models resident in memory now, or ``None`` when the engine has no way to say
        (the inventory then stands for residency, as an engine serving what it was
        started with)."""
        return None

    # -- reading responses ---------------------------------------------------------
    def timings(self, body: Mapping[str, Any]) -> Timings | None:
        """Timings from a finished non-streamed body or a stream's final frame.

        The default reads OpenAI ``usage`` (``prompt_tokens``, ``completion_tokens``,
        ``prompt_tokens_details.cached_tokens``); ``None`` when nothing is reported.
        """
        usage = body.get("usage") if isinstance(body, Mapping) else None
        if not isinstance(usage, Mapping):
            return None
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
        return Timings(
            prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
            cached_tokens=_int_or_none(cached),
            decode_tokens=_int_or_none(usage.get("completion_tokens")),
        )

    def is_final_frame(self, dialect: str, frame: bytes) -> bool:
        """True when ``frame`` (one SSE event's data, or one NDJSON line, without the
        line ending or the ``data:`` prefix) is the dialect's closing frame.

        OpenAI: ``[DONE]``, or a chunk whose first choice has a ``finish_reason``.
        Native: a JSON object with ``"done": true``. An error frame is never final.
        """
        frame = frame.strip()
        if dialect == OPENAI:
            if frame == b"[DONE]":
                return True
            obj = _json_or_none(frame)
            if not isinstance(obj, dict) or "error" in obj:
                return False
            choices = obj.get("choices")
            return bool(choices) and isinstance(choices[0], dict) and bool(
                choices[0].get("finish_reason")
            )
        obj = _json_or_none(frame)
        return isinstance(obj, dict) and obj.get("done") is True

    def request_error(self, status: int, body: Mapping[str, Any]) -> str | None:
        """Classify an error body as a verdict on the request.

        ``body`` is the parsed JSON of a 500 (only 500s are read, at most 64 KB).
        Returns one of :data:`REQUEST_ERROR_SIGNATURES`, or ``None`` when the body is
        not a verdict on the request (the request then fails over as usual).
        """
        return None


def error_message(body: Mapping[str, Any]) -> str | None:
    """The message of an error body in any of the shapes engines use:
    ``{"error": "..."}``, ``{"error": {"message": "..."}}``, ``{"message": "..."}``."""
    err = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(err, str):
        return err
    if isinstance(err, Mapping) and isinstance(err.get("message"), str):
        return err["message"]
    msg = body.get("message") if isinstance(body, Mapping) else None
    return msg if isinstance(msg, str) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
