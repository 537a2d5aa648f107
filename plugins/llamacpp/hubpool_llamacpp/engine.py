"""llama.cpp's llama-server: one model, the window and slot count it was started with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import httpx

from hubpool_core import (
    OPENAI,
    Engine,
    JsonAnswer,
    ModelInfo,
    ProbeResult,
    ResidentModel,
    Timings,
    error_message,
)

#: what ``/health`` answers a loaded server, for a probe that ``/props`` settled
HEALTHY = JsonAnswer(body={"status": "ok"}, status=200)

#: llama-server's Prometheus gauges (``--metrics``): requests generating now, and requests
#: that found every slot busy and wait for one.
PROCESSING = "llamacpp:requests_processing"
DEFERRED = "llamacpp:requests_deferred"

#: how long a listing is reused while ``/props`` names the same server and model: a bound on
#: metadata only ``/v1/models`` carries (the trained window, the file's size) going stale
LISTING_REUSE_S = 30.0


class LlamacppEngine(Engine):
    """llama-server at one base URL: ``/health`` says whether the model is loaded,
    ``/v1/models`` names it, ``/props`` states its window (``n_ctx``) and ``total_slots``."""

    kind = "llamacpp"
    product = "llama-server"
    env_var = "LLAMACPP_URL"
    default_url = "http://127.0.0.1:8080"
    dialects = frozenset({OPENAI})
    states_slots = True
    agent_dialects_by = "probe"
    owned_by_names = frozenset({"llamacpp"})
    #: whether the last probe got an HTTP answer: only then are its reads sent together
    _answered = False
    #: whether the last probe's ``/props`` answered: only then can it stand for ``/health``
    _props_answer = False
    #: the last healthy probe's listing, the ``/props`` identity it was read beside, and when
    _listing: list[Mapping[str, Any]] | None = None
    _identity: tuple[Any, ...] | None = None
    _listed_at = 0.0

    #: Error texts that are a verdict on the request (spec: "A request no node can serve").
    #: First match wins, so the at-once verdicts come before the ones that wait for a second
    #: candidate, and a template refusal naming a missing user turn is "no-user-query".
    request_errors = (
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
        # b1-0c1e570 (llama-cpp-python 0.3.36), answered with 400:
        # "All non-assistant messages must contain 'content'"
        ("invalid-message", r"messages must contain 'content'"),
        ("invalid-message", r"missing content part type|invalid 'content' type|expected 'content'"),
        ("invalid-message", r"invalid message format|invalid role"),
        # minja: "Jinja Exception: ...", "Error rendering chat template ..."
        ("chat-template", r"\bjinja\b|\bchat[ _]template\b"),
    )

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        """Read ``/props`` for the window, the slots and whether the model is loaded, and
        ``/v1/models`` for its name, and judge ``/health`` only when they do not settle it.

        A steady server is one GET: while ``/props`` names the same model file, alias and build
        as when the listing was last read (and for at most :data:`LISTING_REUSE_S`), that
        listing stands, since llama-server lists exactly the model it was started with. A live
        probe per request (poolProbeSnapshotTtlMs 0, the spec's default) then costs one round
        trip and one route. A ``/props`` that names nothing (router mode, older builds) has the
        listing read beside it every time.

        ``/props`` answering 200 settles health: llama-server answers everything but the model
        listing with 503 ("Loading model") until the weights are in memory, so ``/health``
        would say 200 too. When ``/props`` does not answer (a build without it, a server that
        is loading, anything else) ``/health`` is judged first, as before; a build seen without
        ``/props`` is asked all three at once. A server that did not answer last time is asked
        ``/health`` alone first: an absent engine costs one refused connection per probe."""
        known = self._listing if time.monotonic() - self._listed_at <= LISTING_REUSE_S else None
        result = await self._read(http, known, self._identity)
        if not result.healthy:
            self._listing = None  # whatever comes back up is listed afresh
        return result

    async def _read(self, http: httpx.AsyncClient, known: list[Mapping[str, Any]] | None,
                    identity: tuple[Any, ...] | None) -> ProbeResult:
        try:
            listing: Any = None
            props: Any = None
            if self._answered and self._props_answer and known is not None:
                props = await self._props(http)
                if props[0] and props[3] is not None and props[3] == identity:
                    listing = known
                settled = props[0]
                health = HEALTHY if settled else await self.get_json(http, "/health")
            elif self._answered and self._props_answer:
                listing, props = await asyncio.gather(self.openai_models(http), self._props(http),
                                                      return_exceptions=True)
                settled = not isinstance(props, BaseException) and props[0]
                health = HEALTHY if settled else await self.get_json(http, "/health")
            elif self._answered:
                health_read, listing, props = await asyncio.gather(
                    self.get_json(http, "/health"), self.openai_models(http), self._props(http),
                    return_exceptions=True)
                if isinstance(health_read, BaseException):
                    raise health_read
                health = health_read
            else:
                health = await self.get_json(http, "/health")
            self._answered = health.status is not None
            if health.status == 503:
                # "Loading model" (503 unavailable_error) until the weights are in memory;
                # older builds answered {"status": "loading model"}.
                body = health.body
                detail = (error_message(body) or body.get("status")) if isinstance(body, Mapping) else None
                if isinstance(detail, str) and "loading" in detail.lower():
                    error = f"llama-server at {self.base_url} is loading model"
                else:
                    error = f"llama-server at {self.base_url} is unavailable (503: {detail or 'no reason given'})"
                return ProbeResult(running=True, healthy=False, error=error)
            if health.status != 200:  # a 200 that is not JSON still goes on to the listing
                return health.unhealthy()
            if listing is None and props is None:
                listing, props = await asyncio.gather(self.openai_models(http), self._props(http),
                                                      return_exceptions=True)
            elif listing is None:
                listing = await self.openai_models(http)
            if isinstance(listing, BaseException):
                raise listing
            entries = listing
            other = self.other_engine_result(e.get("owned_by") for e in entries)
            if other:
                return other
            if isinstance(props, BaseException):
                raise props
            self._props_answer, n_ctx, slots, named = props
            if named is not None:
                self._listing, self._identity = entries, named
                if entries is not known:
                    self._listed_at = time.monotonic()
            models = tuple(
                ModelInfo(
                    id=e["id"],
                    context_window=(n_ctx or _positive_int(_meta(e).get("n_ctx"))
                                    or _positive_int(_meta(e).get("n_ctx_train"))),
                    size=_positive_int(_meta(e).get("size")),
                    owned_by=e.get("owned_by") if isinstance(e.get("owned_by"), str) else None,
                )
                for e in entries
            )
            return ProbeResult(running=True, healthy=True, models=models, slots=slots)
        except Exception as exc:  # noqa: BLE001 - the contract: a probe never raises, whatever came back
            return self.probe_failure(exc)

    async def residency(self, http: httpx.AsyncClient) -> list[ResidentModel] | None:
        """llama-server holds the model it was started with, at its window, for as long as
        it answers; ``None`` when it cannot be read."""
        result = await self.probe(http)
        if not result.healthy:
            return None
        return [ResidentModel(id=m.id, context_window=m.context_window) for m in result.models]

    async def resident_models(self, http: httpx.AsyncClient) -> list[ResidentModel] | None:
        """In router mode (started without a model), ``GET /models`` lists every model with
        its ``status`` (``loaded``, ``loading``, ``unloaded``): the loaded ones. A server
        started with one model has no such list and holds that model while it answers
        (:meth:`residency`). ``None`` when neither answers."""
        answer = await self.get_json(http, "/models")
        data = answer.body.get("data") if answer.ok and isinstance(answer.body, Mapping) else None
        if isinstance(data, list) and any(isinstance(e, Mapping) and "status" in e for e in data):
            loaded = []
            for entry in data:
                status = entry.get("status") if isinstance(entry, Mapping) else None
                value = status.get("value") if isinstance(status, Mapping) else status
                if value == "loaded" and isinstance(entry.get("id"), str):
                    loaded.append(ResidentModel(id=entry["id"]))
            return loaded
        return await self.residency(http)

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

    async def agent_dialects(self, http: httpx.AsyncClient) -> frozenset[str] | None:
        """By probe: llama-server names no usable version (a build from a source archive
        reports ``b1``), and whether it reranks depends on ``--reranking``, which nothing but
        ``/v1/rerank`` itself tells (501 without it). See :meth:`probe_agent_routes`."""
        return await self.probe_agent_routes(http)

    async def queue_depth(self, http: httpx.AsyncClient) -> int | None:
        """Requests llama-server is running plus the ones deferred for want of a free slot,
        from ``/metrics`` (``llamacpp:requests_processing`` + ``llamacpp:requests_deferred``,
        served only with ``--metrics``); without it, the busy slots of ``/slots``
        (``is_processing``), which cannot see what waits behind them. ``None`` when neither
        answers."""
        try:
            samples = await self.prometheus_samples(http, (PROCESSING, DEFERRED))
            if samples and PROCESSING in samples:
                return max(0, int(samples[PROCESSING] + samples.get(DEFERRED, 0.0)))
            busy = await self._busy_slots(http)
            return busy[0] if busy else None
        except Exception:  # noqa: BLE001 - the contract: no figure rather than an exception
            return None

    async def _busy_slots(self, http: httpx.AsyncClient) -> tuple[int, int] | None:
        """(busy, total) from ``/slots``; ``None`` when it is off (``--no-slots``) or unreadable."""
        answer = await self.get_json(http, "/slots")
        if not answer.ok or not isinstance(answer.body, list):
            return None
        slots = [s for s in answer.body if isinstance(s, Mapping)]
        return sum(1 for s in slots if s.get("is_processing") is True), len(slots)

    async def _props(self, http: httpx.AsyncClient) -> tuple[bool, int | None, int | None, tuple[Any, ...] | None]:
        """(whether ``/props`` answered 200 with an object, per-slot window, slot count, the
        server it names), the count from ``/slots`` when ``/props`` has none; (False, None,
        None, None) when unreadable. The name is the model file, alias and build, ``None`` when
        it names neither file nor alias (router mode, older builds)."""
        answer = await self.get_json(http, "/props")
        body = answer.body if answer.ok else None
        if not isinstance(body, Mapping):
            return False, None, None, None
        settings = body.get("default_generation_settings")
        n_ctx = _positive_int(settings.get("n_ctx")) if isinstance(settings, Mapping) else None
        total = _positive_int(body.get("total_slots"))
        if total is None:
            busy = await self._busy_slots(http)
            total = _positive_int(busy[1]) if busy else None
        named = tuple(body.get(key) for key in ("model_path", "model_alias", "build_info"))
        if not any(isinstance(value, str) and value for value in named[:2]):
            return True, n_ctx, total, None
        return True, n_ctx, total, named


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
