"""vLLM: an OpenAI-compatible server that states each model's window (``max_model_len``)."""

from __future__ import annotations

import httpx

from hubpool_core import OPENAI, Engine, ProbeResult, ResidentModel

#: vLLM's scheduler gauges on ``/metrics`` (one sample per model_name and engine label).
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


class VllmEngine(Engine):
    """vLLM at one base URL: ``GET /v1/models`` is both the health check and the
    inventory, with ``max_model_len`` as each model's window."""

    kind = "vllm"
    product = "vLLM"
    env_var = "VLLM_URL"
    default_url = "http://127.0.0.1:8000"
    dialects = frozenset({OPENAI})
    # spec: "Two engines on port 8000" -- vLLM and oMLX share the default port, and
    # vLLM's listing says owned_by "vllm".
    agent_dialects_by = "probe"
    owned_by_names = frozenset({"vllm"})
    #: Each ``/v1/models`` entry states the window the model runs at.
    listing_window_field = "max_model_len"

    #: Error texts that are a verdict on the request (spec: "A request no node can serve").
    #: First match wins, so the at-once verdicts come before the ones that wait for a second
    #: candidate, and a template refusal naming a missing user turn is "no-user-query".
    request_errors = (
        # Qwen3-family templates: raise_exception('No user query found in messages.')
        ("no-user-query", r"no user query found in messages"),
        # pydantic on a body without messages: "('body', 'messages'), 'msg': 'Field required'"
        ("missing-messages", r"\(\s*'body',\s*'messages'\s*\),\s*'msg':\s*'field required'"),
        # "'messages' is a required property", "messages is required", "empty messages"
        ("missing-messages", r"'?messages'? (?:is a required property|(?:is|are) required)"),
        ("missing-messages", r"\bempty messages\b"),
        # "This model's maximum context length is 32768 tokens. However, you requested ..."
        ("context-length", r"maximum context length is \d+ tokens"),
        # V1 engine: "The decoder prompt (length N) is longer than the maximum model length of M"
        ("context-length", r"longer than the maximum model length"),
        ("invalid-message", r"invalid message format|invalid role"),
        # "jinja2.exceptions.TemplateError: ...", "... you must provide a chat template ..."
        ("chat-template", r"jinja2\.exceptions\.|\bchat[ _]template\b"),
    )

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        """Read ``/v1/models``; a server whose models another engine owns is unhealthy."""
        return await self.probe_openai_listing(http)

    async def agent_dialects(self, http: httpx.AsyncClient) -> frozenset[str] | None:
        """By probe: vLLM registers each route only for the tasks its model supports (a
        generative model has no ``/v1/rerank``, a cross-encoder no ``/v1/messages``), so
        a missing route answers 404. See :meth:`probe_agent_routes`."""
        return await self.probe_agent_routes(http)
    async def resident_models(self, http: httpx.AsyncClient) -> list[ResidentModel] | None:
        """vLLM's sleep mode (``GET /is_sleeping``, served with ``--enable-sleep-mode``): a
        sleeping server has put its weights away and holds nothing until woken; an awake one
        holds what it lists. ``None`` when the route is not served or the answer unreadable
        (the inventory then stands for residency)."""
        answer = await self.get_json(http, "/is_sleeping")
        body = answer.body if answer.ok else None
        sleeping = body.get("is_sleeping") if isinstance(body, dict) else None
        if not isinstance(sleeping, bool):
            return None
        if sleeping:
            return []
        result = await self.probe(http)
        return [ResidentModel(id=m.id, context_window=m.context_window) for m in result.models] \
            if result.healthy else None

    async def queue_depth(self, http: httpx.AsyncClient) -> int | None:
        """Requests vLLM is running plus the ones waiting in its scheduler, from
        ``/metrics`` (``vllm:num_requests_running`` + ``vllm:num_requests_waiting``, summed
        over every model and engine label); ``None`` when ``/metrics`` does not answer or
        carries neither gauge."""
        try:
            samples = await self.prometheus_samples(http, (RUNNING, WAITING))
        except Exception:  # noqa: BLE001 - the contract: no figure rather than an exception
            return None
        if not samples:
            return None
        return max(0, int(samples.get(RUNNING, 0.0) + samples.get(WAITING, 0.0)))
