"""The HTTP server: routes per flavor, the front door every request passes, and the two ways
to run it from a test — :class:`SimServer` in the test's own event loop, :func:`run_in_thread`
for synchronous tests.

The front door counts each request, checks the API key, and serves armed faults before any
handler runs. Client hang-ups are caught there too: the runner is started with
``handler_cancellation=True``, because since aiohttp 3.9 a handler is otherwise left running
after its client has gone, and hubpool's tests need to see that its node's upstream request
was aborted (spec: "Client hang-ups").
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from hubpool_sim import agent, control, native, openai_compat, probes
from hubpool_sim.config import SimConfig
from hubpool_sim.engine import Engine
from hubpool_sim.faults import Fault, coerce_fault, fault_error
from hubpool_sim.flavors import Flavor
from hubpool_sim.replies import (
    CALL,
    ENGINE,
    STARTED,
    Call,
    call_of,
    error_reply,
    is_native,
    json_reply,
    send_truncated,
)
from hubpool_sim.text import body_prompt, count_tokens

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_MAX_BODY = 64 * 1024 * 1024  # agent turns run to hundreds of KB; never refuse one for size


def _routes(flavor: Flavor, engine_config: SimConfig) -> tuple[list[tuple[str, str, Handler]], set[str], set[str],
                                                                set[str]]:
    """The flavor's routes, and which paths generate, embed (or rerank), or answer without
    the API key."""
    app_routes: list[tuple[str, str, Handler]] = []
    prefix = flavor.openai_prefix
    generation = {f"{prefix}/chat/completions", f"{prefix}/completions"}
    embedding = {f"{prefix}/embeddings"}
    app_routes += [
        ("POST", f"{prefix}/chat/completions", openai_compat.chat_completions),
        ("POST", f"{prefix}/completions", openai_compat.completions),
        ("POST", f"{prefix}/embeddings", openai_compat.embeddings),
        ("GET", f"{prefix}/models", openai_compat.models),
    ]
    if flavor.native:
        generation |= {"/api/chat", "/api/generate"}
        embedding |= {"/api/embed", "/api/embeddings"}
        app_routes += [
            ("GET", "/", native.root),
            ("GET", "/api/version", native.version),
            ("GET", "/api/tags", native.tags),
            ("GET", "/api/ps", native.ps),
            ("POST", "/api/show", native.show),
            ("POST", "/api/chat", native.chat),
            ("POST", "/api/generate", native.generate),
            ("POST", "/api/embed", native.embed),
            ("POST", "/api/embeddings", native.embeddings),
        ]
    served = agent.agent_routes(engine_config)
    agent_handlers: list[tuple[str, str, Handler]] = [
        ("POST", agent.MESSAGES, agent.messages), ("POST", agent.COUNT_TOKENS, agent.count_message_tokens),
        ("POST", agent.RESPONSES, agent.responses), ("GET", agent.RESPONSES + "/{response_id}", agent.get_response),
        ("POST", agent.RERANK, agent.rerank),
    ]
    for method, path, handler in agent_handlers:
        base = path.split("/{")[0]
        if base in served and (method == "POST" or engine_config.flavor == "vllm"):
            app_routes.append((method, path, handler))
    generation |= served & {agent.MESSAGES, agent.RESPONSES}
    embedding |= served & {agent.RERANK}
    extra: dict[str, list[tuple[str, Handler]]] = {
        "vllm": [("/health", probes.vllm_health), ("/metrics", probes.vllm_metrics),
                 ("/is_sleeping", probes.vllm_is_sleeping)],
        "llamacpp": [("/health", probes.llamacpp_health), ("/props", probes.llamacpp_props),
                     ("/slots", probes.llamacpp_slots), ("/models", probes.llamacpp_models)],
        "lemonade": [("/api/v1/health", probes.lemonade_health)],
        "omlx": [("/health", probes.omlx_health)],
    }
    app_routes += [("GET", path, handler) for path, handler in extra.get(flavor.name, [])]
    # Health probes answer without the key, as vLLM and llama-server exempt theirs.
    open_paths = {"/", "/metrics"} | ({flavor.health_path} if flavor.health_path else set())
    return app_routes, generation, embedding, open_paths


def build_app(engine: Engine) -> web.Application:
    routes, generation, embedding, open_paths = _routes(engine.flavor, engine.config)
    inference = generation | embedding

    @web.middleware
    async def front_door(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/_sim/"):
            return await handler(request)
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = None
        call = request[CALL] = Call(body if isinstance(body, dict) else {})
        model = call.body.get("model") or call.body.get("name")
        model = model if isinstance(model, str) else None
        _note_arrival(engine, request, model, len(raw))

        task = asyncio.current_task()
        engine.tasks.add(task)
        try:
            if body is None or (raw and not isinstance(body, dict)):
                response = error_reply(request, 400, "invalid JSON in request body: expected an object")
            else:
                response = await _serve(request, handler, model, inference=request.path in inference,
                                        generation=request.path in generation, open_path=request.path in open_paths)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            # a field of the wrong JSON type: llama-server and Ollama refuse such a body with a
            # 400 naming the field's type, before anything is generated (never a 500)
            if request.get(STARTED):
                raise
            response = error_reply(request, 400, f"a field of the request has the wrong type ({exc})")
        except web.HTTPException:  # the router's 404/405: answered, so completed
            _note_end(engine, "completed")
            raise
        except asyncio.CancelledError:
            _note_end(engine, call.outcome)
            raise
        except ConnectionError:
            # A write found the client gone before the cancellation did. Ending the task
            # cancelled keeps aiohttp from logging it as a server error.
            _note_end(engine, "aborted")
            raise asyncio.CancelledError from None
        finally:
            engine.tasks.discard(task)
        _note_end(engine, "completed")
        return response

    async def _serve(request: web.Request, handler: Handler, model: str | None, *, inference: bool,
                     generation: bool, open_path: bool) -> web.StreamResponse:
        key = engine.config.api_key
        if key and not open_path and request.headers.get("Authorization") != f"Bearer {key}":
            return error_reply(request, 401, engine.flavor.unauthorized)
        # a body naming no model on an inference route is a route probe, never served: no fault
        probe = inference and model is None
        fault = None if probe else engine.faults.take(request.path, model, inference=inference,
                                                      generation=generation)
        if fault is None:
            return await handler(request)
        engine.stats.faults_served += 1
        call = call_of(request)
        call.fault = fault
        known = engine.config.find_model(model)
        failure = fault_error(fault, engine.flavor, native=is_native(request), window=known.window if known else 4096,
                              prompt_tokens=count_tokens(body_prompt(call.body)))
        if failure:
            return json_reply(*failure)
        if fault.kind == "hang":  # no headers, ever: wait for the client (or stop()) to end it
            await asyncio.Event().wait()
        response = await handler(request)
        if fault.kind == "drop" and not inference and isinstance(response, web.Response):
            return await send_truncated(request, response)  # a listing or probe cut half-way
        return response

    app = web.Application(middlewares=[front_door], client_max_size=_MAX_BODY)
    app[ENGINE] = engine
    if engine.config.name:
        name = engine.config.name

        async def stamp(request: web.Request, response: web.StreamResponse) -> None:
            response.headers["X-Sim-Name"] = name

        app.on_response_prepare.append(stamp)
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    control.add_routes(app)
    return app


def _note_arrival(engine: Engine, request: web.Request, model: str | None, body_bytes: int) -> None:
    stats = engine.stats
    stats.requests += 1
    stats.by_path[request.path] += 1
    if model:
        stats.by_model[model] += 1
    headers: dict[str, Any] = {k.lower(): v for k, v in request.headers.items()
                               if k.lower().startswith(("x-hub-pool-", "anthropic-"))}
    headers["authorization"] = "Authorization" in request.headers
    stats.last_request = {"path": request.path, "model": model, "headers": headers, "body_bytes": body_bytes}


def _note_end(engine: Engine, outcome: str) -> None:
    if not engine.stopping:
        setattr(engine.stats, outcome, getattr(engine.stats, outcome) + 1)


class SimServer:
    """One simulated engine on a real socket, in the running event loop.

    ``port=0`` (the default, unless the config names one) takes an ephemeral port; ``url``
    says which. Use ``async with`` or
    :meth:`start` / :meth:`stop`. The control methods act directly on the engine, exactly as
    the /_sim/ routes do.
    """

    def __init__(self, config: SimConfig | None = None, host: str | None = None, port: int | None = None) -> None:
        self.config = config if config is not None else SimConfig()
        self.host = host if host is not None else self.config.host
        self.port = port if port is not None else (self.config.port or 0)
        self.engine = Engine(self.config)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> SimServer:
        runner = web.AppRunner(build_app(self.engine), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        """Close the socket and end every handler still running (a hung one included)."""
        if self._runner is None:
            return
        self.engine.stopping = True
        for task in list(self.engine.tasks):
            task.cancel()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> SimServer:
        return await self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.stop()

    def stats(self) -> dict[str, Any]:
        return self.engine.snapshot()

    def add_fault(self, fault: str | Fault | dict[str, Any], model: str | None = None, count: int | None = None,
                  path: str | None = None) -> Fault:
        """Arm a fault: a spec ("drop", "error:503@qwen3:8b:2"), a mapping or a Fault.

        ``model``, ``count`` and ``path`` given here override those in the spec.
        """
        armed = coerce_fault(fault)
        armed = Fault(armed.kind, model=model if model is not None else armed.model,
                      count=count if count is not None else armed.count, path=path if path is not None else armed.path)
        return self.engine.faults.add(armed)

    def clear_faults(self) -> None:
        self.engine.faults.clear()

    def reset(self) -> None:
        """Zero the counters and disarm every fault."""
        self.engine.reset()

    def configure(self, **changes: Any) -> None:
        """Change speed and capacity at runtime: slots, prefill_tps, decode_tps, ..."""
        self.engine.configure(changes)


class ThreadedSimServer:
    """A :class:`SimServer` running its own event loop in a daemon thread, for sync tests.

    Same attributes and methods; each call is carried into the server's loop, so reading the
    stats never races a request being counted.
    """

    def __init__(self, config: SimConfig | None = None, host: str | None = None, port: int | None = None) -> None:
        self.server = SimServer(config, host, port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    config = property(lambda self: self.server.config)
    engine = property(lambda self: self.server.engine)
    host = property(lambda self: self.server.host)
    port = property(lambda self: self.server.port)
    url = property(lambda self: self.server.url)

    def start(self, timeout: float = 10.0) -> ThreadedSimServer:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:  # noqa: BLE001 - report a failed start (port taken) to the caller
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"hubpool-sim-{self.server.config.flavor}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError("hubpool-sim did not start in time")
        if failure:
            raise failure[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is None or self._thread is None:
            return
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        asyncio.run_coroutine_threadsafe(self.server.stop(), loop).result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._loop is None:
            return method(*args, **kwargs)

        async def call() -> Any:
            return method(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(10.0)

    def stats(self) -> dict[str, Any]:
        return self._call(self.server.stats)

    def add_fault(self, fault: str | Fault | dict[str, Any], model: str | None = None, count: int | None = None,
                  path: str | None = None) -> Fault:
        return self._call(self.server.add_fault, fault, model, count, path)

    def clear_faults(self) -> None:
        self._call(self.server.clear_faults)

    def reset(self) -> None:
        self._call(self.server.reset)

    def configure(self, **changes: Any) -> None:
        self._call(self.server.configure, **changes)

    def __enter__(self) -> ThreadedSimServer:
        return self.start() if self._loop is None else self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


@contextmanager
def run_in_thread(
    config: SimConfig | None = None, host: str | None = None, port: int | None = None
) -> Iterator[ThreadedSimServer]:
    """``with run_in_thread(cfg) as sim:`` — a running simulator for synchronous code."""
    threaded = ThreadedSimServer(config, host, port).start()
    try:
        yield threaded
    finally:
        threaded.stop()
