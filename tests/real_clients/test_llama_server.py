"""Each real client finishes a turn through a node against this CI's real llama-server.

The model is the generated tiny GGUF of tests/real_engine (random weights, a byte-level
vocabulary) written with a 64k training context: the clients' first turns are 16-20k tokens,
and no model file on the registries CI reaches (PyPI, npm, Debian) is both that small and
that long-windowed, so it is generated rather than fetched. One slot at -c 65536 holds the
longest turn. Its output is random bytes that never end a turn on their own, and Claude Code
takes an answer cut at its token limit for an error: so the server answers greedily (--temp 0
--top-k 1) with the model's end-of-turn token pushed first (a logit bias), and every client's
turn ends at once, the same way every run (-n 16 only guards Codex, which asks for no limit).
llama-server serves Messages and Responses itself, so Claude Code's and Codex's turns reach it
byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import RunningNode
from real_clients.agents import AGENTS
from real_clients.support import routing_rows, settled_rows, summary
from real_engine.support import MODEL_ID, LlamaServer, require_llama_server, write_tiny_gguf

pytestmark = [pytest.mark.real_clients, pytest.mark.timeout(900)]

#: the training context written into the generated model, and the server's window
CONTEXT = 65536
#: the route each client's turn takes
ROUTE = {"claude-code": "/v1/messages", "codex": "/v1/responses", "opencode": "/v1/chat/completions"}


@pytest.fixture(scope="module")
def llama_node(tmp_path_factory):
    binary = require_llama_server()
    root = tmp_path_factory.mktemp("llama")
    model = write_tiny_gguf(root / "tiny-64k.gguf", n_ctx_train=CONTEXT)
    end_of_turn = _eos_token(model)
    server = LlamaServer(binary, model, slots=1, ctx=CONTEXT, log_dir=root,
                         extra=("--jinja", "-n", "16", "--temp", "0", "--top-k", "1",
                                "--logit-bias", f"{end_of_turn}+10")).start(timeout=60)
    try:
        with RunningNode(root / "node", {"LLAMACPP_URL": server.url}) as node:
            yield node, server
    finally:
        server.stop()


def _eos_token(model: Path) -> int:
    import gguf

    field = gguf.GGUFReader(str(model)).fields["tokenizer.ggml.eos_token_id"]
    return int(field.parts[field.data[0]][0])


def test_the_generated_model_has_a_64k_training_context(llama_node):
    import httpx

    _node, server = llama_node
    listed = httpx.get(server.url + "/v1/models", timeout=10, trust_env=False).json()["data"][0]
    assert listed["id"] == MODEL_ID and listed["meta"]["n_ctx_train"] == CONTEXT


@pytest.mark.parametrize("agent", AGENTS)
def test_each_client_finishes_a_turn_against_a_real_llama_server(agent, llama_node, agent_run):
    node, server = llama_node
    seen = {r["id"] for r in routing_rows(node)}
    client = agent_run(agent, node)
    assert client.setup["model"] == MODEL_ID
    turn = client.run("Say hello in five words.", timeout=800)
    assert turn.succeeded, turn.describe() + "\n--- llama-server\n" + server.log_tail()
    rows = settled_rows(node, seen)
    assert rows and all(r["outcome"] == "served" and r["backend"] == "llamacpp" for r in rows), summary(rows)
    assert {r["path"] for r in rows} == {ROUTE[agent]}, summary(rows)
    # the turn was the client's whole first prompt, not a toy: thousands of tokens through the engine
    assert max(r["bodyBytes"] for r in rows) > 25_000, rows
