"""Shared by the stream tests of issue 28 (tests/test_stream_*.py): a two-node pool on
loopback whose engines are simulators a test arms with stream faults, each dialect's request
for the same question, and readers of each dialect's stream (its text, its events)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from harness import RunningNode, fqdn, make_pool, pair, poll_until_offered

from hubpool_sim import SimConfig, SimModel, ThreadedSimServer, run_in_thread

#: served by a llama-server on each node (every dialect natively) and by an Ollama from before
#: the agent dialects on each node (Messages and Responses translated to chat completions)
NATIVE_MODEL, OLLAMA_MODEL = "m:8b", "n:8b"
P = "/api/inference/pool"
QUESTION = "Why is the sky blue?"
BUDGET_MS = 1500

#: (dialect, model): each dialect the issue names, natively and translated where it can be
CASES = [("openai", NATIVE_MODEL), ("openai", OLLAMA_MODEL), ("native", OLLAMA_MODEL), ("messages", NATIVE_MODEL),
         ("messages", OLLAMA_MODEL), ("responses", NATIVE_MODEL), ("responses", OLLAMA_MODEL)]
CASE_IDS = ["chat", "chat-ollama", "native", "messages", "messages-translated", "responses", "responses-translated"]


def start_pool(stack: ExitStack, root: Path, *, tokens: int = 12, text: str = "tokens",
               environ: dict[str, str] | None = None) -> tuple[dict[str, RunningNode], dict[str, ThreadedSimServer]]:
    """hub-a and hub-b, paired, each beside a simulated llama-server (NATIVE_MODEL) and Ollama
    (OLLAMA_MODEL); header budgets of BUDGET_MS."""
    sims = {f"{hub}-{flavor}": stack.enter_context(run_in_thread(SimConfig(
        flavor=flavor, models=[SimModel(NATIVE_MODEL if flavor == "llamacpp" else OLLAMA_MODEL, window=32768)],
        tokens=tokens, text=text, decode_ms_per_token=5)))
        for hub in ("a", "b") for flavor in ("llamacpp", "ollama")}
    env = {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1", "HUB_POOL_DEV_FIRST_BYTE_FLOOR_MS": str(BUDGET_MS),
           "HUB_POOL_FIRST_BYTE_TIMEOUT_MS": str(BUDGET_MS), **(environ or {})}
    nodes = make_pool(root, ["hub-a", "hub-b"], env, per_node={
        hub: {"LLAMACPP_URL": sims[f"{hub[-1]}-llamacpp"].url, "OLLAMA_URL": sims[f"{hub[-1]}-ollama"].url}
        for hub in ("hub-a", "hub-b")})
    for node in nodes.values():
        stack.enter_context(node)
    pair(nodes["hub-a"], nodes["hub-b"])
    for model in (NATIVE_MODEL, OLLAMA_MODEL):
        poll_until_offered(nodes["hub-a"], [nodes["hub-b"]], model)
    return nodes, sims


def forgive(nodes: dict[str, RunningNode]) -> None:
    """Forget every strike the last test's faults earned (two strikes withhold an engine for a
    minute, and each test here means to ask the same engine again)."""
    for node in nodes.values():
        for book in (node.node.output_quarantine, node.node.unservable):
            book._records.clear()  # test hygiene between cases, not a product path


def sim_for(sims: dict[str, ThreadedSimServer], hub: str, model: str) -> ThreadedSimServer:
    return sims[f"{hub}-{'llamacpp' if model == NATIVE_MODEL else 'ollama'}"]


def settings(node: RunningNode, **changes: Any) -> None:
    with node.client(headers=node.headers()) as c:
        r = c.patch(P + "/settings", json=changes)
    assert r.status_code == 200, r.text


def row(node: RunningNode, rid: str) -> dict[str, Any]:
    with node.client(headers=node.headers()) as c:
        rows = c.get(P + "/routing-log?limit=500").json()["entries"]
    return next(r for r in rows if r["id"] == rid)


def request(dialect: str, model: str, *, tokens: int | None = None, prefix: str | None = None) -> tuple[str, dict]:
    """The route and streamed body asking QUESTION in ``dialect``."""
    if dialect == "responses":
        items: list[Any] = [{"type": "message", "role": "user", "content": QUESTION}]
        body: dict[str, Any] = {"model": model, "input": items, "stream": True}
        if tokens:
            body["max_output_tokens"] = tokens
        return "/v1/responses", body
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "stream": True}
    if dialect == "native":
        if tokens:
            body["options"] = {"num_predict": tokens}
        return "/api/chat", body
    if tokens or dialect == "messages":  # Messages must say; the pool's engines answer 12 unasked
        body["max_tokens"] = tokens or 12
    return ("/v1/messages" if dialect == "messages" else "/v1/chat/completions"), body


def events(raw: bytes) -> list[tuple[str | None, Any]]:
    """An SSE body as (event name, JSON data or "[DONE]"); comments are dropped."""
    out = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
        if data is not None:
            out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


def text_of(dialect: str, raw: bytes) -> str:
    """The answer's text in a stream of ``dialect`` (the app's side)."""
    if dialect == "native":
        return "".join((json.loads(line).get("message") or {}).get("content", "")
                       for line in raw.decode().splitlines() if line.strip())
    out = []
    for _name, data in events(raw):
        if data == "[DONE]" or not isinstance(data, dict):
            continue
        if dialect == "openai":
            out += [(c.get("delta") or {}).get("content") or "" for c in data.get("choices") or []]
        elif dialect == "messages" and data.get("type") == "content_block_delta":
            out.append(data["delta"].get("text", ""))
        elif dialect == "responses" and data.get("type") == "response.output_text.delta":
            out.append(data["delta"])
    return "".join(out)


def error_of(dialect: str, raw: bytes) -> str | None:
    """The message of the dialect's error event ending a stream, or None."""
    if dialect == "native":
        last = json.loads(raw.decode().splitlines()[-1]) if raw.strip() else {}
        return last.get("error")
    for name, data in events(raw):
        if not isinstance(data, dict):
            continue
        if dialect == "messages" and name == "error":
            return data["error"]["message"]
        if dialect == "responses" and data.get("type") == "response.failed":
            return data["response"]["error"]["message"]
        if dialect == "openai" and "error" in data:
            return data["error"]["message"]
    return None


def stream(node: RunningNode, dialect: str, model: str, timeout: float = 30, **kw: Any) -> httpx.Response:
    route, body = request(dialect, model, **kw)
    with httpx.Client(base_url=node.url, timeout=timeout, trust_env=False) as c:
        return c.post(route, json=body)


def served_by(hub: str) -> str:
    return "local" if hub == "hub-a" else fqdn(hub)
