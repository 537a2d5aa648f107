"""Resume on real llama-servers (issue 28 item 4): two nodes on loopback, each beside its own
``llama-server`` on a generated tiny model, and one streamed answer cut mid-way on hub-a's
engine and resumed on hub-b's, next to the same answer uninterrupted.

Shared by tests/real_engine/test_resume_real.py (bounded) and measure_resume.py (the figure in
docs/reliability.md). The models are the real-engine tests' tiny GGUF with its output layer
rewritten, so what greedy decoding can say is chosen:

- ``bytes``: the tiny model as the other real-engine tests use it: random bytes, many not
  UTF-8, which llama-server streams as U+FFFD and holds back a frame for while a character is
  incomplete;
- ``ascii``: printable ASCII and the vocabulary's merged tokens (``tt`` … ``" t"``), so a
  text the model wrote can tokenise differently when read back;
- ``aligned``: printable ASCII without ``t`` or ``T``, so no merge can ever apply: a text the
  model wrote tokenises back into exactly the tokens it generated, and every frame is one
  token.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fault.faultproxy import FaultProxy, Toxic
from harness import RunningNode, make_pool, pair, poll_until_offered
from real_engine import support
from real_engine.support import MODEL_ID, LlamaServer, write_tiny_gguf
from streams import text_of

P = "/api/inference/pool"
MODELS = ("bytes", "ascii", "aligned")
QUESTION = "Why is the sky blue?"
#: merged tokens of the tiny model's vocabulary (support.write_tiny_gguf), after its 256 bytes
_MERGED = ("tt", "tttt", "tttttttt", " tttttttt", " t")


def write_model(path: Path, kind: str) -> Path:
    """The tiny GGUF for ``kind`` (see the module docstring): the real-engine tests' model,
    its output rows for tokens the model must never say zeroed and the others scaled up, so
    the greedy choice is always one of the allowed tokens and rarely a near tie."""
    import gguf

    write_tiny_gguf(path)
    if kind == "bytes":
        return path
    allowed = [b for b in range(0x20, 0x7F) if kind == "ascii" or chr(b) not in "tT"]
    if kind == "ascii":
        allowed += [256 + i for i in range(len(_MERGED))]
    reader = gguf.GGUFReader(str(path), "r+")
    [tensor] = [t for t in reader.tensors if t.name == "output.weight"]
    rows = tensor.data  # a writable view of the file: (n_vocab, n_embd)
    rng = np.random.default_rng(7)
    scaled = np.zeros_like(rows)
    scaled[allowed] = rng.standard_normal((len(allowed), rows.shape[1])).astype(rows.dtype)
    rows[...] = scaled
    reader.data.flush()
    return path


@dataclass
class Pool:
    """hub-a and hub-b, each beside its own llama-server on the same model file, hub-a with
    resume on; hub-a's engine is the first candidate (pinned). With ``proxy``, hub-a reaches
    its engine through a FaultProxy (tests/fault/faultproxy.py), so a test can cut the answer
    at a byte it chooses."""

    nodes: dict[str, RunningNode]
    servers: dict[str, LlamaServer]
    proxy: FaultProxy | None
    stack: ExitStack

    @property
    def a(self) -> RunningNode:
        return self.nodes["hub-a"]

    def close(self) -> None:
        self.stack.close()


def start_pool(root: Path, binary: Path, model: Path, stall_ms: int = 1500, proxy: bool = False) -> Pool:
    servers = {hub: LlamaServer(binary, model, slots=1, ctx=4096, log_dir=root) for hub in ("hub-a", "hub-b")}
    stack = ExitStack()
    try:
        for server in servers.values():
            server.start()
            stack.callback(server.stop)
        front = stack.enter_context(FaultProxy(servers["hub-a"].port)) if proxy else None
        urls = {"hub-a": front.url if front is not None else servers["hub-a"].url, "hub-b": servers["hub-b"].url}
        nodes = make_pool(root, ["hub-a", "hub-b"], {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1"},
                          per_node={hub: {"LLAMACPP_URL": url} for hub, url in urls.items()})
        for node in nodes.values():
            stack.enter_context(node)
        pair(nodes["hub-a"], nodes["hub-b"])
        poll_until_offered(nodes["hub-a"], [nodes["hub-b"]], MODEL_ID)
        with nodes["hub-a"].client(headers=nodes["hub-a"].headers()) as c:
            # the tiny models repeat themselves: the loop rule would cut what is measured here
            assert c.patch(P + "/settings", json={"poolStreamResume": 1, "poolStreamStallMs": stall_ms,
                                                 "poolStreamLoopGuard": 0}).is_success
            assert c.post(P + "/pins", json={"scope": "default", "targetKind": "local"}).is_success
    except BaseException:
        stack.close()
        raise
    return Pool(nodes, servers, front, stack)


#: each dialect's route, and how its body names the token budget
ROUTES = {"openai": "/v1/chat/completions", "native": "/api/chat", "messages": "/v1/messages",
          "responses": "/v1/responses"}


def body(dialect: str, tokens: int, question: str = QUESTION) -> dict[str, Any]:
    """A greedy streamed request (temperature 0, a fixed seed) in ``dialect``."""
    if dialect == "responses":
        return {"model": MODEL_ID, "input": [{"type": "message", "role": "user", "content": question}],
                "stream": True, "max_output_tokens": tokens, "temperature": 0}
    out: dict[str, Any] = {"model": MODEL_ID, "messages": [{"role": "user", "content": question}], "stream": True}
    if dialect == "native":
        out["options"] = {"num_predict": tokens, "temperature": 0, "seed": 42}
    else:
        out.update(max_tokens=tokens, temperature=0)
    if dialect == "openai":
        out.update(seed=42, stream_options={"include_usage": True})
    return out


def whole_frames(dialect: str, raw: bytes) -> bytes:
    """The frames of a stream read so far that are whole (a read can end inside one)."""
    sep = b"\n" if dialect == "native" else b"\n\n"
    return raw[: raw.rfind(sep) + len(sep)] if sep in raw else b""


@dataclass
class Run:
    """One resumed answer beside the same answer uninterrupted."""

    dialect: str
    whole: str
    resumed: str
    raw: bytes
    row: dict[str, Any]
    how: str

    @property
    def cut_at(self) -> int | None:
        cuts = self.row.get("resumedFrom") or []
        return cuts[0]["atChars"] if cuts else None

    @property
    def equal(self) -> bool:
        return self.resumed == self.whole


def post(pool: Pool, dialect: str, tokens: int, question: str = QUESTION) -> httpx.Response:
    with httpx.Client(base_url=pool.a.url, timeout=120, trust_env=False) as c:
        r = c.post(ROUTES[dialect], json=body(dialect, tokens, question))
    assert r.status_code == 200, r.text
    return r


def resumed_run(pool: Pool, dialect: str, tokens: int, after_chars: int, how: str = "stall",
                question: str = QUESTION) -> Run:
    """The answer streamed from hub-a; once the app has read ``after_chars`` characters of it,
    hub-a's llama-server is SIGSTOPped (``stall``: hub-a's stall rule ends the attempt) or
    SIGKILLed (``kill``: the connection breaks), and hub-b's continues the answer. The engine
    is let go (SIGCONT) or started again on its port before this returns."""
    whole = text_of(dialect, post(pool, dialect, tokens, question).content)
    server = pool.servers["hub-a"]
    raw, hit = b"", False
    try:
        with httpx.stream("POST", pool.a.url + ROUTES[dialect], json=body(dialect, tokens, question),
                          timeout=httpx.Timeout(120), trust_env=False) as r:
            assert r.status_code == 200
            rid = r.headers["x-hub-pool-request-id"]
            for chunk in r.iter_raw():
                raw += chunk
                if not hit and len(text_of(dialect, whole_frames(dialect, raw))) >= after_chars:
                    hit = True
                    assert server.proc is not None
                    os.kill(server.proc.pid, signal.SIGSTOP if how == "stall" else signal.SIGKILL)
    finally:
        if hit:
            _recover(server, how)
    return Run(dialect, whole, text_of(dialect, raw), raw, settled_row(pool.a, rid), how)


def _recover(server: LlamaServer, how: str) -> None:
    assert server.proc is not None
    if how == "stall":
        os.kill(server.proc.pid, signal.SIGCONT)
        return
    server.proc.wait(10)
    # the node knows its engine by URL: started again on the same port
    port, chosen = server.port, support.free_port
    support.free_port = lambda: port
    try:
        server.start()
    finally:
        support.free_port = chosen


def settled_row(node: RunningNode, rid: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        with node.client(headers=node.headers()) as c:
            rows = c.get(P + "/routing-log?limit=500").json()["entries"]
        found = [r for r in rows if r["id"] == rid]
        if found and found[0]["outcome"] != "pending":
            return found[0]
        assert time.monotonic() < deadline, f"row {rid} not settled: {found}"
        time.sleep(0.05)


# -- a cut the test places: after the k-th text frame, through hub-a's FaultProxy ---------------

#: the route hub-a asks its llama-server on for each dialect (native chat is translated)
UPSTREAM = {"openai": "/v1/chat/completions", "native": "/v1/chat/completions", "messages": "/v1/messages",
            "responses": "/v1/responses"}
#: what marks a frame carrying text in llama-server's answer on that route
_TEXT_FRAME = {"/v1/chat/completions": b'"content":"', "/v1/messages": b'"text_delta"',
               "/v1/responses": b'"response.output_text.delta"'}


def frame_end(head: bytes, marker: bytes, frames: int) -> int:
    """The offset in a response's first bytes (headers included) just past its ``frames``-th
    text frame (ValueError when the bytes end before it)."""
    at, seen = head.index(b"\r\n\r\n"), 0
    while seen < frames:
        end = head.index(b"\n\n", at)
        seen += marker in head[at:end]
        at = end + 2
    return at


def cut_run(pool: Pool, dialect: str, tokens: int, frames: int, question: str = QUESTION) -> Run:
    """The answer uninterrupted, then again with hub-a's engine going silent (a blackhole at
    the proxy) a few bytes into the text frame after the ``frames``-th: the app has exactly
    ``frames`` tokens' frames when hub-a's stall rule ends the attempt and hub-b continues.
    The same request's answer has the same bytes up to there (only its id, time stamp and
    Date header differ, in the same lengths), so the uninterrupted run places the cut."""
    assert pool.proxy is not None
    route = UPSTREAM[dialect]
    whole = text_of(dialect, post(pool, dialect, tokens, question).content)
    seen = [r for r in pool.proxy.records if r.first_line.startswith(f"POST {route} ")]
    assert seen, f"the proxy saw no {route}"
    nbytes = frame_end(seen[-1].head, _TEXT_FRAME[route], frames) + 8
    pool.proxy.arm(Toxic("blackhole", nbytes=nbytes, count=1, match=f"POST {route} ".encode()))
    try:
        response = post(pool, dialect, tokens, question)
    finally:
        pool.proxy.clear()
    rid = response.headers["x-hub-pool-request-id"]
    return Run(dialect, whole, text_of(dialect, response.content), response.content, settled_row(pool.a, rid), "cut")


def smallest_gap_after(server: LlamaServer, tokens: int, after: int, question: str = QUESTION) -> tuple[str, float]:
    """The greedy answer from ``server`` itself and the smallest difference between its two
    likeliest tokens' log-probabilities at any token past the first ``after``: where that is
    tiny, the rounding of another pass can choose the other token."""
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, trust_env=False, json={
        "model": MODEL_ID, "messages": [{"role": "user", "content": question}], "max_tokens": tokens,
        "temperature": 0, "seed": 42, "logprobs": True, "top_logprobs": 2})
    choice = r.json()["choices"][0]
    gaps = [t["top_logprobs"][0]["logprob"] - t["top_logprobs"][1]["logprob"]
            for t in choice["logprobs"]["content"][after:]]
    return choice["message"]["content"], min(gaps)
