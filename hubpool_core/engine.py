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

Four more, the agent dialects (:data:`AGENT_DIALECTS`), are served natively by some
engines and some versions only, so an engine says which per instance
(:meth:`Engine.agent_dialects`); a request in one its engine does not serve is translated
to chat completions (rerank, which has no translation, goes only where it is served):

``"messages"``
    Anthropic's Messages API, ``POST /v1/messages``; a stream is SSE events ending in
    ``message_stop``.
``"count-tokens"``
    ``POST /v1/messages/count_tokens`` (``{"input_tokens": N}``).
``"responses"``
    OpenAI's Responses API, ``POST /v1/responses``; a stream is SSE events ending in
    ``response.completed``.
``"rerank"``
    ``POST /v1/rerank`` (the Jina/Cohere shape: ``query``, ``documents``, ``results``).

The core asks what an engine *can do* (``dialects``, ``agent_dialects``,
``renders_own_template``, ``states_slots``), never what it *is*: ``kind`` is a label for
headers and logs.
"""

from __future__ import annotations

import asyncio
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hubpool_core.probe_http import FastAnswer, ProbeClient

OPENAI = "openai"
NATIVE = "native"
MESSAGES = "messages"
COUNT_TOKENS = "count-tokens"
RESPONSES = "responses"
RERANK = "rerank"
#: The dialects an engine may or may not serve natively, by version or build.
AGENT_DIALECTS = (MESSAGES, COUNT_TOKENS, RESPONSES, RERANK)
#: Where each dialect asks for the answer's length, as paths into the body (Ollama's sits in
#: ``options``), in the order engines honour them: OpenAI's newer ``max_completion_tokens``
#: wins over ``max_tokens``. A dialect not named here asks with ``max_tokens``.
ANSWER_LIMITS: dict[str, tuple[tuple[str, ...], ...]] = {
    OPENAI: (("max_completion_tokens",), ("max_tokens",)),
    RESPONSES: (("max_output_tokens",),),
    NATIVE: (("options", "num_predict"),),
}
_ANY_ANSWER_LIMIT = tuple(dict.fromkeys(path for paths in ANSWER_LIMITS.values() for path in paths))


def answer_limit(body: Any, dialect: str | None = None) -> tuple[dict[str, Any], str, int] | None:
    """Where a request asks for its answer's length: (the object that holds it, its key, the
    tokens), or ``None`` when it asks for none (a missing, non-integer or non-positive value).
    ``dialect`` ``None`` reads any dialect's key; the proxy's resume spends from the one found,
    the slot clock plans by it."""
    for path in ANSWER_LIMITS.get(dialect, (("max_tokens",),)) if dialect is not None else _ANY_ANSWER_LIMIT:
        holder = body
        for part in path[:-1]:
            holder = holder.get(part) if isinstance(holder, dict) else None
        value = holder.get(path[-1]) if isinstance(holder, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return holder, path[-1], value
    return None


#: Statuses that say a route does not exist on an engine: not found, wrong method, and
#: llama-server's 501 for rerank on a server started without ``--reranking``.
ROUTE_MISSING = frozenset({404, 405, 501})

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
    ``queue_depth`` is what the engine itself reported running plus waiting when it was
    asked (:meth:`Engine.queue_depth`, only with ``poolEngineQueueDepth`` on), or ``None``.
    ``dialects`` is which :data:`AGENT_DIALECTS` the engine serves natively, as
    :meth:`Engine.agent_dialects` last found (the core fills it and caches it), or ``None``
    when not known (treated as none: those requests are translated).
    """

    running: bool
    healthy: bool
    models: tuple[ModelInfo, ...] = ()
    error: str | None = None
    slots: int | None = None
    queue_depth: int | None = None
    dialects: frozenset[str] | None = None


@dataclass(frozen=True)
class JsonAnswer:
    """What one :meth:`Engine.get_json` call got back.

    ``error`` is ``None`` exactly when the engine answered 200 with JSON; otherwise it is
    the operator-facing sentence saying what went wrong (refused, timed out, key refused,
    another status, not JSON), ready for :attr:`ProbeResult.error`.
    ``body`` is the parsed JSON whenever the answer was JSON, *whatever its status*
    (so a 503's error body can be read); ``None`` when there was no answer or it was not
    JSON (a JSON ``null`` is also ``None``, with ``error`` still ``None`` on a 200).
    ``status`` is the HTTP status, or ``None`` when nothing answered the request.
    ``running`` says something listened at the base URL: ``False`` only for a refused
    connection or one not made in time, ``True`` for a read timeout or any HTTP answer.
    """

    body: Any = None
    error: str | None = None
    status: int | None = None
    running: bool = True

    @property
    def ok(self) -> bool:
        """True for a 200 with JSON (``error`` is ``None``)."""
        return self.error is None

    def unhealthy(self) -> ProbeResult:
        """This failed answer as a probe result: ``running`` as it was, never healthy."""
        return ProbeResult(running=self.running, healthy=False, error=self.error)


class ProbeFailed(Exception):
    """Raised by a probe step that cannot go on (see :meth:`Engine.require_json`).

    ``error`` is the operator-facing sentence; ``running`` says whether anything answered.
    :meth:`Engine.probe_failure` turns it into an unhealthy :class:`ProbeResult`, so a
    multi-step probe can ``raise`` from any depth and keep the "probes never raise" rule.
    """

    def __init__(self, error: str, *, running: bool = True) -> None:
        super().__init__(error)
        self.error = error
        self.running = running

    def result(self) -> ProbeResult:
        """The unhealthy :class:`ProbeResult` this failure stands for."""
        return ProbeResult(running=self.running, healthy=False, error=self.error)


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

    Helpers for writing :meth:`probe` (the plugin keeps only what is its engine's own):
    :meth:`get_json` / :meth:`require_json` (one authenticated GET, every failure as an
    operator's sentence), :meth:`wrong_answer` and :meth:`probe_failure` (the rest of the
    sentences), :meth:`openai_models` (the model listing), :meth:`other_engine_result`
    (a server that names another engine in ``owned_by``), and :meth:`probe_openai_listing`
    (the whole probe of an engine whose listing is its health check). Declaring
    :attr:`request_errors` is enough for :meth:`request_error`.

    Defining a subclass checks and compiles :attr:`request_errors` (an unknown signature
    or a bad pattern raises at import, so the plugin shows as inactive with the reason),
    defaults :attr:`product` to :attr:`kind`, and records the class, so other engines
    can recognise its :attr:`owned_by_names` (see :meth:`other_engine_named`).
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
    #: True when the engine renders its own chat template and runs a model at the window
    #: the request (``options.num_ctx``) or the node's context cap names (Ollama), so its
    #: window is known from those. (Whether a refusal speaks for another engine is decided
    #: by engine kind, never by this flag: every kind parses messages its own way.)
    renders_own_template: ClassVar[bool] = False
    #: True when an operator's slot statement (``ollamaSlots``) describes this engine.
    states_slots: ClassVar[bool] = False
    #: True when the engine can tell what it holds in memory (:meth:`residency`).
    has_residency: ClassVar[bool] = False
    #: The engine's name as operators know it (for example ``vLLM``), used in every error
    #: sentence. Defaults to :attr:`kind` for a class that sets ``kind`` but not this.
    product: ClassVar[str]
    #: ``owned_by`` values (matched trimmed and lower-case) by which this engine names
    #: itself in an OpenAI model listing. A server listing only these, or only names no
    #: engine claims, is left alone; one naming another engine's is that engine
    #: (:meth:`other_engine_named`). Empty: the engine states no owner of its own.
    owned_by_names: ClassVar[frozenset[str]] = frozenset()
    #: Error texts that are a verdict on the request, as ``(signature, regex)`` rows:
    #: signature one of :data:`REQUEST_ERROR_SIGNATURES`, regex searched
    #: case-insensitively in :func:`error_message` of the body. First match wins, so put
    #: the at-once verdicts before the ones that wait for a second candidate. Checked and
    #: compiled once, when the class is defined.
    request_errors: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: The field of an OpenAI model-listing entry that states the window the engine runs
    #: the model at (for example ``max_model_len``), read by :meth:`probe_openai_listing`;
    #: ``None`` when the listing states none.
    listing_window_field: ClassVar[str | None] = None
    #: How :meth:`agent_dialects` decides, as ``hubpool plugins`` shows it: ``"version"``,
    #: ``"probe"``, or ``"none"`` (the default: it serves none of them; all are translated).
    agent_dialects_by: ClassVar[str] = "none"
    #: Where each agent dialect's route is on this engine, for :meth:`probe_agent_routes`.
    agent_routes: ClassVar[Mapping[str, str]] = {
        MESSAGES: "/v1/messages",
        COUNT_TOKENS: "/v1/messages/count_tokens",
        RESPONSES: "/v1/responses",
        RERANK: "/v1/rerank",
    }

    #: ``request_errors`` compiled (filled by ``__init_subclass__``).
    _request_error_patterns: ClassVar[tuple[tuple[str, re.Pattern[str]], ...]] = ()
    #: Every Engine subclass defined in this process, by (module, qualified name), in
    #: definition order; a re-imported module replaces its classes rather than adding.
    _defined: ClassVar[dict[tuple[str, str], type[Engine]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "product" not in cls.__dict__ and "kind" in cls.__dict__:
            cls.product = cls.kind
        names = cls.owned_by_names
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"{cls.__qualname__}.owned_by_names must be a set of strings, got {names!r}")
        cls.owned_by_names = frozenset(_owner(n) for n in names) - {""}
        if "request_errors" in cls.__dict__:
            cls._request_error_patterns = _compile_request_errors(cls.__qualname__, cls.request_errors)
        Engine._defined[(cls.__module__, cls.__qualname__)] = cls

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")

    # -- reaching the engine -------------------------------------------------------
    def auth_headers(self) -> dict[str, str]:
        """Headers that authenticate this node to the engine; empty when it needs none."""
        if self.config.api_key:
            return {"Authorization": f"Bearer {self.config.api_key}"}
        return {}

    @property
    def api_key_var(self) -> str:
        """The variable holding this node's key for the engine: ``<NAME>_API_KEY`` beside
        :attr:`env_var` ``<NAME>_URL``."""
        return self.env_var.removesuffix("_URL") + "_API_KEY"

    def url_hint(self) -> str:
        """Where the operator changes the URL, for the end of an error sentence:
        ``"<ENV_VAR> points here"`` when the URL came from it, else ``"set <ENV_VAR>"``."""
        if self.config.source == self.env_var:
            return f"{self.env_var} points here"
        return f"set {self.env_var}"

    async def get_json(self, http: httpx.AsyncClient, path: str, *,
                       timeout: float | None = None) -> JsonAnswer:
        """GET ``base_url + path`` with :meth:`auth_headers` and read the answer as JSON.

        Never raises for anything the network or the server does. ``timeout`` (seconds)
        overrides the client's for this one request. Every failure is a
        :class:`JsonAnswer` whose ``error`` tells the operator what to do:

        * nothing listening: ``connection refused at <url> (is <product> running?
          set <ENV_VAR>)`` (``running=False``); a connection not made in time:
          ``no connection to <url> within the probe timeout (...)`` (``running=False``);
        * connected but no answer in time: ``<url> took the connection but did not answer
          GET <path> in time``; another transport failure: ``GET <url><path> failed: ...``
          (``running`` only when something listened: protocol or read errors);
        * 401/403: ``<product> at <url> refused this node's API key (401); check
          <NAME>_API_KEY``, or, holding no key, ``... wants an API key (401) and this node
          holds none for it (set <NAME>_API_KEY)``;
        * any other non-200: ``<product> at <url> answered GET <path> with 503`` followed
          by ``: <message>`` when the body has one (:func:`error_message`);
        * a 200 that is not JSON: :meth:`wrong_answer` ``"with something that is not JSON"``.
        """
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        hint = f"(is {self.product} running? {self.url_hint()})"
        response: FastAnswer | httpx.Response
        try:
            if isinstance(http, ProbeClient):  # the node's own probes: aiohttp's cost (probe_http)
                response = await http.fast_get(self.base_url + path, self.auth_headers(), timeout)
            else:
                response = await http.get(self.base_url + path, headers=self.auth_headers(), **extra)
        except httpx.ConnectTimeout:
            return JsonAnswer(error=f"no connection to {self.base_url} within the probe timeout {hint}",
                              running=False)
        except httpx.ConnectError:
            return JsonAnswer(error=f"connection refused at {self.base_url} {hint}", running=False)
        except httpx.TimeoutException:
            return JsonAnswer(error=f"{self.base_url} took the connection but did not answer "
                                    f"GET {path} in time")
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            # A protocol or read error means something listened; anything else, nothing did.
            answered = isinstance(exc, (httpx.ProtocolError, httpx.ReadError))
            return JsonAnswer(error=f"GET {self.base_url}{path} failed: {exc or type(exc).__name__}",
                              running=answered)
        status = response.status_code
        try:
            body, is_json = response.json(), True
        except (ValueError, RecursionError):
            body, is_json = None, False
        return JsonAnswer(body=body, error=self._answer_error(path, status, body, is_json), status=status)

    def _answer_error(self, path: str, status: int, body: Any, is_json: bool) -> str | None:
        """The operator's sentence for an HTTP answer that is not a 200 with JSON."""
        if status in (401, 403):
            if self.config.api_key:
                return (f"{self.product} at {self.base_url} refused this node's API key ({status}); "
                        f"check {self.api_key_var}")
            return (f"{self.product} at {self.base_url} wants an API key ({status}) and this node "
                    f"holds none for it (set {self.api_key_var})")
        if status != 200:
            detail = error_message(body)
            return (f"{self.product} at {self.base_url} answered GET {path} with {status}"
                    + (f": {detail}" if detail else ""))
        if not is_json:
            return self.wrong_answer(path, "with something that is not JSON").error
        return None

    async def require_json(self, http: httpx.AsyncClient, path: str, *,
                           timeout: float | None = None) -> Any:
        """:meth:`get_json`'s body of a 200 with JSON; any failure raises
        :class:`ProbeFailed` carrying its sentence and ``running``."""
        answer = await self.get_json(http, path, timeout=timeout)
        if answer.error is not None:
            raise ProbeFailed(answer.error, running=answer.running)
        return answer.body

    async def openai_models(self, http: httpx.AsyncClient) -> list[Mapping[str, Any]]:
        """The entries of the engine's OpenAI model listing (``GET <openai_prefix>/models``)
        that carry a string ``id``, in the engine's order; malformed entries are skipped.
        A failed GET (see :meth:`get_json`) or an answer without a ``data`` list raises
        :class:`ProbeFailed` (``... without a model list (is it <product>? ...)``).
        Whether the listing names another engine is :meth:`other_engine_result`."""
        path = self.openai_prefix + "/models"
        body = await self.require_json(http, path)
        data = body.get("data") if isinstance(body, Mapping) else None
        if not isinstance(data, list):
            raise self.wrong_answer(path, "without a model list")
        return [e for e in data if isinstance(e, Mapping) and isinstance(e.get("id"), str)]

    async def probe_openai_listing(self, http: httpx.AsyncClient) -> ProbeResult:
        """A whole probe for an engine whose OpenAI model listing is both its health check
        and its inventory: :meth:`openai_models`, then :meth:`other_engine_result`, then one
        :class:`ModelInfo` per entry (``id``, ``owned_by``, and the window from
        :attr:`listing_window_field` when it is a positive integer). Never raises."""
        try:
            entries = await self.openai_models(http)
            other = self.other_engine_result(e.get("owned_by") for e in entries)
            if other:
                return other
            field_ = self.listing_window_field
            models = tuple(
                ModelInfo(id=e["id"], owned_by=_text(e.get("owned_by")),
                          context_window=_positive_int(e.get(field_)) if field_ else None)
                for e in entries
            )
            return ProbeResult(running=True, healthy=True, models=models)
        except Exception as exc:  # noqa: BLE001 - the contract: a probe never raises, whatever came back
            return self.probe_failure(exc)

    def wrong_answer(self, path: str, what: str) -> ProbeFailed:
        """A failure for a server that answered but not as this engine does, to raise:
        ``the server at <url> answered GET <path> <what> (is it <product>? set <ENV_VAR>)``,
        with ``what`` such as ``"without a model list"``. ``running`` is ``True``."""
        return ProbeFailed(f"the server at {self.base_url} answered GET {path} {what} "
                           f"(is it {self.product}? {self.url_hint()})")

    def probe_failure(self, exc: BaseException) -> ProbeResult:
        """The unhealthy result of a probe that stopped on ``exc``: a :class:`ProbeFailed`
        says its own sentence; anything else (an answer of a shape the code did not expect)
        is ``running=True`` with ``could not read the answer of <url>: <exc>``. Lets a
        probe end in ``except Exception as exc: return self.probe_failure(exc)``."""
        if isinstance(exc, ProbeFailed):
            return exc.result()
        return ProbeResult(running=True, healthy=False,
                           error=f"could not read the answer of {self.base_url}: {exc!r}")

    # -- telling engines apart -------------------------------------------------------
    def other_engine_named(self, owned_by_values: Iterable[Any]) -> str | None:
        """The :attr:`product` of another engine the ``owned_by`` values name, else ``None``.

        ``owned_by_values`` are the ``owned_by`` fields of a model listing (anything;
        compared trimmed and lower-case, non-strings ignored). ``None`` when any value is
        one of this class's :attr:`owned_by_names` (the server names this engine), or
        when none is claimed by another Engine subclass defined in this process (generic
        owners such as ``organization-owner`` or ``system`` name no engine). Values are
        tried in sorted order and classes in definition order, so the answer is stable.
        """
        other = self._other_engine_class(owned_by_values)
        return other.product if other is not None else None

    def other_engine_result(self, owned_by_values: Iterable[Any]) -> ProbeResult | None:
        """The probe result for a server whose listing names another engine, else ``None``.

        Spec: a server naming another engine is ``running=True, healthy=False`` with
        ``the server at <url> is <other>, not <product> (point <ENV_VAR> at <product>)``;
        when both engines' :attr:`default_url` use the same port, the parenthesis first
        says ``<product> and <other> both default to port <port>;``. One naming no engine
        is left alone (``None``). See :meth:`other_engine_named`.
        """
        other = self._other_engine_class(owned_by_values)
        if other is None:
            return None
        port = _default_port(type(self))
        shared = (f"{self.product} and {other.product} both default to port {port}; "
                  if port is not None and port == _default_port(other) else "")
        return ProbeResult(running=True, healthy=False,
                           error=f"the server at {self.base_url} is {other.product}, not {self.product} "
                                 f"({shared}point {self.env_var} at {self.product})")

    def _other_engine_class(self, owned_by_values: Iterable[Any]) -> type[Engine] | None:
        owners = {_owner(v) for v in owned_by_values if isinstance(v, str)} - {""}
        if owners & self.owned_by_names:
            return None
        for owner in sorted(owners):
            for cls in Engine._defined.values():
                if cls is not type(self) and owner in cls.owned_by_names:
                    return cls
        return None

    def upstream_path(self, dialect: str, route: str) -> str:
        """The engine's path for an app-facing ``route`` in ``dialect``.

        ``route`` is the app-facing path (``/v1/chat/completions``, ``/api/chat``).
        OpenAI routes, and the agent dialects' (``/v1/messages``, ``/v1/responses``,
        ``/v1/rerank``), are re-rooted under :attr:`openai_prefix`; native routes pass
        through unchanged.
        """
        if dialect != NATIVE and route.startswith("/v1/"):
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

    async def agent_dialects(self, http: httpx.AsyncClient) -> frozenset[str] | None:
        """Which of :data:`AGENT_DIALECTS` this engine serves natively, byte for byte.

        Asked after a healthy probe, once, then again every few minutes and after the engine
        was seen down (an upgrade restarts it); never on the request path. Decide by the
        version the engine reports where it reports one (Ollama's ``/api/version``), else by
        :meth:`probe_agent_routes`. The default, an empty set, is "none of them": requests in
        those dialects are translated to chat completions, and rerank (which has no
        translation) is not offered here. ``None`` is "cannot tell now" (asked again at the
        next probe, and treated as none meanwhile). Never raises.
        """
        return frozenset()

    async def probe_agent_routes(self, http: httpx.AsyncClient,
                                 dialects: Iterable[str] = AGENT_DIALECTS) -> frozenset[str] | None:
        """The ``dialects`` whose :attr:`agent_routes` exist on this engine, found by sending
        each an empty JSON object (``{}``), which no engine can act on: 404, 405 or 501
        (:data:`ROUTE_MISSING`) says the route is missing; any other answer (the 400 or 422
        of a body missing its fields) says it is there. ``None`` when an answer cannot tell:
        no connection, or 401/403 (the key is refused, so nothing is known). Never raises."""
        async def status(path: str) -> int | None:
            try:
                response = await http.post(self.base_url + path, json={}, headers=self.auth_headers())
            except (httpx.HTTPError, httpx.InvalidURL):
                return None
            return response.status_code

        asked = [(d, self.agent_routes[d]) for d in dialects if d in self.agent_routes]
        statuses = await asyncio.gather(*(status(path) for _, path in asked))
        if any(code is None or code in (401, 403) for code in statuses):
            return None
        return frozenset(d for (d, _), code in zip(asked, statuses, strict=True) if code not in ROUTE_MISSING)
    async def resident_models(self, http: httpx.AsyncClient) -> list[ResidentModel] | None:
        """Which models the engine holds in memory now, read off the request path to price a
        cold load into predicted time to first token and advertised to peers as ``resident``.

        Return every model resident now (an empty list: the engine is up and holds none, so
        each model it lists must load first), or ``None`` when the engine cannot say right
        now (no such API, the read failed, an answer of an unknown shape): ``None`` is
        unknown and never read as cold. Called every health-poll interval, never per request;
        it must answer within a few seconds and never raise. The default asks
        :meth:`residency` when :attr:`has_residency`, else returns ``None`` (the node then
        takes the engine's inventory as loaded, as for an engine serving what it was started
        with). Override for an engine whose memory state has its own API beside its
        residency (a sleep mode, a model router)."""
        if not self.has_residency:
            return None
        return await self.residency(http)

    async def queue_depth(self, http: httpx.AsyncClient) -> int | None:
        """Requests the engine itself reports running or waiting now, whoever sent them,
        or ``None`` when it offers no such figure (the default). Read after a healthy probe
        only while ``poolEngineQueueDepth`` is on; like a probe it never raises. It closes
        the gap the proxy's own count leaves: work that reached the engine directly."""
        return None

    async def prometheus_samples(self, http: httpx.AsyncClient, names: Iterable[str],
                                 path: str = "/metrics") -> dict[str, float] | None:
        """The Prometheus text at ``path``, each of ``names`` summed over its label sets
        (a name absent from the text is absent from the answer). ``None`` when the GET
        fails, answers non-200, or is not Prometheus text. Never raises."""
        try:
            response = await http.get(self.base_url + path, headers=self.auth_headers())
        except (httpx.HTTPError, httpx.InvalidURL):
            return None
        if response.status_code != 200:
            return None
        wanted = set(names)
        out: dict[str, float] = {}
        try:
            for family in text_string_to_metric_families(response.text):
                for sample in family.samples:
                    if sample.name in wanted:
                        out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
        except (ValueError, TypeError, IndexError, KeyError):
            return None  # not Prometheus text: say nothing rather than half of it
        return out

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
        Native: a JSON object with ``"done": true``. Messages: the ``message_stop`` event.
        Responses: ``response.completed`` (or ``response.incomplete``, an answer cut at its
        ``max_output_tokens`` as asked). An error frame is never final. The frame is the
        engine's, unvalidated: any bytes must give an answer, never raise (a malformed frame
        is simply not final).
        """
        frame = frame.strip()
        if dialect in (MESSAGES, RESPONSES):
            obj = _json_or_none(frame)
            finals = ("message_stop",) if dialect == MESSAGES else ("response.completed", "response.incomplete")
            return isinstance(obj, dict) and obj.get("type") in finals
        if dialect == OPENAI:
            if frame == b"[DONE]":
                return True
            obj = _json_or_none(frame)
            if not isinstance(obj, dict) or "error" in obj:
                return False
            choices: Any = obj.get("choices")  # any JSON value: only a list of objects is read
            return isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict) and bool(
                choices[0].get("finish_reason")
            )
        obj = _json_or_none(frame)
        return isinstance(obj, dict) and obj.get("done") is True

    def request_error(self, status: int, body: Mapping[str, Any]) -> str | None:
        """Classify an error body as a verdict on the request.

        ``body`` is the parsed JSON of a 500 (only 500s are read, at most 64 KB), and may
        be any JSON value. Returns one of :data:`REQUEST_ERROR_SIGNATURES`, or ``None``
        when the body is not a verdict on the request (the request then fails over as
        usual). The default returns the signature of the first :attr:`request_errors` row
        whose regex matches :func:`error_message` of the body (``None`` without a
        message); override only for a verdict a message regex cannot express.
        """
        message = error_message(body)
        if not message:
            return None
        for signature, pattern in self._request_error_patterns:
            if pattern.search(message):
                return signature
        return None


def error_message(body: Any) -> str | None:
    """The message of an error body in any of the shapes engines use:
    ``{"error": "..."}``, ``{"error": {"message": "..."}}``, ``{"message": "..."}``, and
    FastAPI's ``{"detail": "..."}`` (a ``detail`` list of validation errors is no message).
    ``None`` for anything else, including a body that is not a JSON object."""
    if not isinstance(body, Mapping):
        return None
    err = body.get("error")
    if isinstance(err, str):
        return err
    if isinstance(err, Mapping) and isinstance(message := err.get("message"), str):
        return message
    for key in ("message", "detail"):
        if isinstance(value := body.get(key), str):
            return value
    return None


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _owner(value: str) -> str:
    return value.strip().lower()


def _default_port(cls: type[Engine]) -> int | None:
    try:
        return httpx.URL(cls.default_url).port
    except (AttributeError, httpx.InvalidURL, TypeError):
        return None


def _compile_request_errors(owner: str, table: Any) -> tuple[tuple[str, re.Pattern[str]], ...]:
    """``request_errors`` checked and compiled; a mistake raises naming the class."""
    compiled = []
    for row in table:
        if not (isinstance(row, tuple) and len(row) == 2 and all(isinstance(x, str) for x in row)):
            raise TypeError(f"{owner}.request_errors rows are (signature, regex) string pairs, got {row!r}")
        signature, pattern = row
        if signature not in REQUEST_ERROR_SIGNATURES:
            raise ValueError(f"{owner}.request_errors: unknown signature {signature!r} "
                             f"(one of {', '.join(REQUEST_ERROR_SIGNATURES)})")
        try:
            compiled.append((signature, re.compile(pattern, re.IGNORECASE)))
        except re.error as exc:
            raise ValueError(f"{owner}.request_errors: bad regex for {signature!r}: {exc}") from exc
    return tuple(compiled)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None
