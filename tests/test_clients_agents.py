"""Agent clients through the pool: the official anthropic and openai SDKs on /v1/messages,
/v1/messages/count_tokens, /v1/responses and /v1/rerank, through one node and across a hop.

Two real nodes on loopback, paired, shared by every test here (module scope). hub-b holds
the models: a llama-server serving the agent dialects natively (native:8b), an Ollama from
before them (trans:8b, translated to chat completions) and a vLLM that stores responses and
reranks (stored:8b, bge-reranker). hub-a, the entry of the hop tests, holds none of them:
only a llama-server started without --reranking that lists bge-reranker all the same.
"""

from __future__ import annotations

import json
from contextlib import ExitStack

import anthropic
import httpx
import openai
import pytest
from harness import fqdn, make_pool, pair, poll_until_offered

from hubpool_core.config import DEFAULT_SESSION_SOURCES
from hubpool_sim import SimConfig, SimModel, run_in_thread

NATIVE, TRANSLATED, STORED, RERANKER = "native:8b", "trans:8b", "stored:8b", "bge-reranker"
WEATHER = {"name": "get_weather", "description": "The weather in a place",
           "input_schema": {"type": "object", "properties": {"location": {"type": "string"}},
                            "required": ["location"]}}
CLOCK = {"name": "get_time", "description": "The time in a zone",
         "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}
FUNCTION = {"type": "function", "name": "get_weather", "description": "The weather in a place",
            "parameters": WEATHER["input_schema"]}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("agents")
    with ExitStack() as stack:
        sims = {
            "a-llamacpp": SimConfig(flavor="llamacpp", models=[SimModel(RERANKER, reranker=False)]),
            "b-llamacpp": SimConfig(flavor="llamacpp", models=[SimModel(NATIVE, window=32768)]),
            "b-ollama": SimConfig(flavor="ollama", models=[SimModel(TRANSLATED, window=32768)]),
            "b-vllm": SimConfig(flavor="vllm", models=[SimModel(STORED), SimModel(RERANKER, reranker=True)]),
        }
        sims = {name: stack.enter_context(run_in_thread(cfg)) for name, cfg in sims.items()}
        nodes = make_pool(root, ["hub-a", "hub-b"], per_node={
            "hub-a": {"LLAMACPP_URL": sims["a-llamacpp"].url},
            "hub-b": {"LLAMACPP_URL": sims["b-llamacpp"].url, "OLLAMA_URL": sims["b-ollama"].url,
                      "VLLM_URL": sims["b-vllm"].url},
        })
        for n in nodes.values():
            stack.enter_context(n)
        pair(nodes["hub-a"], nodes["hub-b"])
        for model in (NATIVE, TRANSLATED, STORED, RERANKER):
            poll_until_offered(nodes["hub-a"], [nodes["hub-b"]], model)
        yield nodes, sims


def _entry(pool, where):
    nodes, _ = pool
    return nodes["hub-b" if where == "local" else "hub-a"]


def _served_by(where):
    return "local" if where == "local" else fqdn("hub-b")


def _claude(node) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=node.url, api_key="unused-inside", max_retries=0)


def _codex(node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused-inside", max_retries=0)


def _row(node, rid):
    with node.client(headers=node.headers()) as c:
        rows = c.get("/api/inference/pool/routing-log?limit=500").json()["entries"]
    return next(r for r in rows if r["id"] == rid)


WHERE = ["local", "hop"]
MODES = [(NATIVE, "llamacpp"), (TRANSLATED, "ollama")]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("model,backend", MODES, ids=["native", "translated"])
def test_messages_create_not_streamed(pool, where, model, backend):
    raw = _claude(_entry(pool, where)).messages.with_raw_response.create(
        model=model, max_tokens=5, messages=[{"role": "user", "content": "hello"}])
    assert raw.headers["x-hub-pool-served-by"] == _served_by(where)
    assert raw.headers["x-hub-pool-backend"] == backend
    message = raw.parse()
    assert message.content[0].type == "text" and message.content[0].text == "tok0 tok1 tok2 tok3 tok4"
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5
    assert message.usage.input_tokens > 0


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("model,backend", MODES, ids=["native", "translated"])
def test_messages_streamed_tool_use_then_tool_result(pool, where, model, backend):
    """Parallel tool_use blocks streamed, each one's input_json_delta pieces adding up to its
    whole JSON input; then the tool_result turn, answered with text."""
    client = _claude(_entry(pool, where))
    asked = [{"role": "user", "content": "weather and time in Oslo?"}]
    pieces: dict[int, str] = {}
    with client.messages.stream(model=model, max_tokens=64, tools=[WEATHER, CLOCK], messages=asked) as stream:
        assert stream.response.headers["x-hub-pool-served-by"] == _served_by(where)
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                pieces[event.index] = pieces.get(event.index, "") + event.delta.partial_json
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [u.name for u in uses] == ["get_weather", "get_time"]
    assert uses[0].input == {"location": "tok0 tok1"} and uses[1].input == {"zone": "tok0 tok1"}
    assert len(pieces) == 2 and all(len(p) > 0 for p in pieces.values())
    assert [json.loads(pieces[i]) for i in sorted(pieces)] == [u.input for u in uses]  # whole JSON, in pieces
    results = [{"type": "tool_result", "tool_use_id": u.id, "content": "sunny, 12:00"} for u in uses]
    answer = client.messages.create(model=model, max_tokens=4, tools=[WEATHER, CLOCK], messages=[
        *asked, {"role": "assistant", "content": final.content}, {"role": "user", "content": results}])
    assert answer.content[0].type == "text" and answer.content[0].text.startswith("tok0")
    assert answer.stop_reason == "max_tokens"


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("model", [NATIVE, TRANSLATED], ids=["native", "translated"])
def test_messages_count_tokens(pool, where, model):
    counted = _claude(_entry(pool, where)).messages.count_tokens(
        model=model, system="You are terse.", messages=[{"role": "user", "content": "how long is this prompt?"}])
    assert 5 <= counted.input_tokens <= 30


def test_count_tokens_translated_is_a_one_token_completion(pool):
    _, sims = pool
    before = sims["b-ollama"].stats()["by_path"].get("/v1/chat/completions", 0)
    _claude(_entry(pool, "hop")).messages.count_tokens(model=TRANSLATED, messages=[{"role": "user", "content": "x"}])
    stats = sims["b-ollama"].stats()
    assert stats["by_path"]["/v1/chat/completions"] == before + 1
    assert "/v1/messages/count_tokens" not in stats["by_path"]  # this Ollama has no such route


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("model,backend", MODES, ids=["native", "translated"])
def test_responses_function_call_and_result_turn(pool, where, model, backend):
    client = _codex(_entry(pool, where))
    raw = client.responses.with_raw_response.create(model=model, input="hello", max_output_tokens=6)
    assert raw.headers["x-hub-pool-served-by"] == _served_by(where) and raw.headers["x-hub-pool-backend"] == backend
    assert raw.parse().output_text == "tok0 tok1 tok2 tok3 tok4 tok5"
    events = list(client.responses.create(model=model, input="weather in Oslo?", tools=[FUNCTION], stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"location": "tok0 tok1"}
    call = next(i for i in events[-1].response.output if i.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"location": "tok0 tok1"}
    follow = client.responses.create(model=model, tools=[FUNCTION], input=[
        {"role": "user", "content": "weather in Oslo?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert follow.status == "completed" and follow.output_text.startswith("tok0")


PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}


@pytest.mark.parametrize("where", ["local", "hop"])
def test_codex_turns_with_custom_and_hosted_tools_and_reasoning_items_translated(pool, where):
    """Codex's own shapes through a node to a chat-completions engine: hosted tools dropped, a
    custom tool called as a function and answered as a custom_tool_call (the official SDK
    parses it, streamed and not), and the next turn, carrying a reasoning item, the custom
    call and its output as a list of parts and store: false, answered."""
    client = _codex(_entry(pool, where))
    tools = [PATCH_TOOL, {"type": "web_search"}, {"type": "namespace", "name": "multi_agent_v1",
                                                  "description": "agents", "tools": []}]
    whole = client.responses.create(model=TRANSLATED, input="patch it", tools=tools, store=False,
                                    include=["reasoning.encrypted_content"], prompt_cache_key="k-1")
    call = whole.output[0]
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == "tok0 tok1"
    events = list(client.responses.create(model=TRANSLATED, input="patch it", tools=tools, stream=True,
                                          store=False))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.custom_tool_call_input.done" in kinds
    assert events[-1].response.output[0].type == "custom_tool_call"
    follow = client.responses.create(model=TRANSLATED, tools=tools, store=False, input=[
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "patch it"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB"},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch", "input": call.input},
        {"type": "custom_tool_call_output", "call_id": call.call_id,
         "output": [{"type": "input_text", "text": "Done"}]}])
    assert follow.status == "completed" and follow.output_text.startswith("tok0")


def test_previous_response_id_goes_to_the_node_that_holds_it_and_says_when_it_is_gone(pool):
    nodes, sims = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    client = _codex(a)
    first = client.responses.with_raw_response.create(model=STORED, input="remember tok")
    assert first.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    rid = first.parse().id
    then = client.responses.with_raw_response.create(model=STORED, input="and now?", previous_response_id=rid)
    assert then.headers["x-hub-pool-served-by"] == fqdn("hub-b") and then.parse().status == "completed"
    assert sims["b-vllm"].stats()["last_request"]["path"] == "/v1/responses"
    fetched = client.responses.retrieve(rid)
    assert fetched.id == rid and fetched.output_text
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model=STORED, input="x", previous_response_id="resp_nobody_made_this")
    assert "not known to this node" in unknown.value.body["message"]
    with a.client(headers=a.headers()) as c:  # hub-b out of the pool for hub-a: the holder is gone
        assert c.post(f"/api/inference/pool/peers/{fqdn('hub-b')}/disable").status_code == 200
        try:
            with pytest.raises(openai.NotFoundError) as gone:
                client.responses.create(model=STORED, input="x", previous_response_id=rid)
        finally:
            assert c.post(f"/api/inference/pool/peers/{fqdn('hub-b')}/enable").status_code == 200
    assert gone.value.status_code == 404 and fqdn("hub-b") in gone.value.body["message"]
    assert gone.value.body["code"] == "previous_response_not_found"
    assert b.url  # hub-b itself never stopped: it is hub-a's view that lost it


@pytest.mark.parametrize("spelling", ["/v1/rerank", "/v1/reranking", "/rerank"])
def test_rerank_across_a_hop_goes_to_the_only_engine_that_reranks(pool, spelling):
    nodes, sims = pool
    before = sims["a-llamacpp"].stats()["by_model"].get(RERANKER, 0)
    r = httpx.post(nodes["hub-a"].url + spelling, json={
        "model": RERANKER, "query": "capital of france", "top_n": 2,
        "documents": ["reranking is fun", "paris is the capital of france", "vllm serves models"]})
    assert r.status_code == 200, r.text
    assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b") and r.headers["x-hub-pool-backend"] == "vllm"
    results = r.json()["results"]
    assert [x["index"] for x in results][0] == 1 and len(results) == 2
    # hub-a's own llama-server lists the model but was started without --reranking: never asked
    assert sims["a-llamacpp"].stats()["by_model"].get(RERANKER, 0) == before


def test_capabilities_say_which_engines_serve_which_dialect(pool):
    nodes, _ = pool
    with nodes["hub-a"].client(headers=nodes["hub-a"].headers()) as c:
        peer = next(p for p in c.get("/api/inference/pool/status").json()["peers"])
    kinds = {b["type"]: b.get("dialects") for b in peer["lastCapabilities"]["backends"]}
    # its llama-server was started without --reranking: /v1/rerank answers 501 there
    assert kinds["llamacpp"] == ["count-tokens", "messages", "openai", "responses"]
    assert kinds["ollama"] == ["native", "openai"]  # 0.12.6: before Responses and Messages
    assert set(kinds["vllm"]) == {"openai", "messages", "count-tokens", "responses", "rerank"}


def test_anthropic_headers_reach_the_engine(pool):
    _, sims = pool
    _claude(_entry(pool, "hop")).messages.create(
        model=NATIVE, max_tokens=2, messages=[{"role": "user", "content": "hi"}],
        extra_headers={"anthropic-version": "2023-06-01", "anthropic-beta": "prompt-caching-2024-07-31"})
    seen = sims["b-llamacpp"].stats()["last_request"]["headers"]
    assert seen["anthropic-version"] == "2023-06-01" and seen["anthropic-beta"] == "prompt-caching-2024-07-31"


def test_an_outside_caller_uses_x_api_key_or_bearer_and_is_refused_in_each_dialect(pool):
    nodes, _ = pool
    node = nodes["hub-b"]
    _row_, key = node.node.keys.create("agent", "inference")
    outside = {"cf-ray": "8a1b2c3d4e5f-AMS"}
    body = {"model": NATIVE, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with node.client() as c:
        refused = c.post("/v1/messages", json=body, headers=outside)
        assert refused.status_code == 401
        assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "authentication_error"
        assert c.post("/v1/messages", json=body, headers={**outside, "x-api-key": "nope"}).status_code == 401
        assert c.post("/v1/messages", json=body, headers={**outside, "x-api-key": key}).status_code == 200
        assert c.post("/v1/messages", json=body, headers={**outside, "Authorization": f"Bearer {key}"}).status_code \
            == 200
        r = c.post("/v1/responses", json={"model": NATIVE, "input": "hi"}, headers=outside)
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    claude = anthropic.Anthropic(base_url=node.url, api_key=key, max_retries=0, default_headers=outside)
    assert claude.messages.create(model=NATIVE, max_tokens=2, messages=[{"role": "user", "content": "hi"}]).content


def _anthropic_shape(r):
    body = r.json()
    return body.get("type") == "error" and isinstance(body["error"]["message"], str) and body["error"]["type"]


def _openai_shape(r):
    body = r.json()
    return isinstance(body["error"]["message"], str) and "type" in body["error"]


# what the door still refuses: a body no engine could serve (not JSON, not an object, no
# model) and a model no node lists, each in the dialect's own error shape
NO_MODEL = {"messages": [{"role": "user", "content": "x"}], "input": "x", "query": "q", "documents": ["a"]}
DOOR_REFUSED = [(b"{not json", 400), (b"[]", 400), (b'"just a string"', 400), (json.dumps(NO_MODEL).encode(), 400),
                (json.dumps({**NO_MODEL, "model": 7}).encode(), 400),
                (json.dumps({**NO_MODEL, "model": "nobody-has:1b"}).encode(), 404)]


@pytest.mark.parametrize("route,shape", [
    ("/v1/messages", _anthropic_shape), ("/v1/messages/count_tokens", _anthropic_shape),
    ("/v1/responses", _openai_shape), ("/v1/rerank", _openai_shape)])
def test_a_body_no_engine_could_serve_gets_the_dialects_error_shape_and_a_4xx(pool, route, shape):
    node = _entry(pool, "hop")
    with node.client() as c:
        for raw, status in DOOR_REFUSED:
            r = c.post(route, content=raw, headers={"Content-Type": "application/json"})
            assert r.status_code == status, (route, raw, r.status_code, r.text)
            assert shape(r), (route, raw, r.text)


# bodies the door used to refuse and an engine may well serve (issue 25): the engine judges.
# Each is (route, body without model, what the simulated engine answers)
ENGINE_JUDGES = [
    ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"},
                                                     {"role": "system", "content": "env"}]}, 200),
    ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, 200),
    ("/v1/messages", {"max_tokens": "5", "system": 7, "messages": [{"role": "user", "content": "x"}]}, 200),
    ("/v1/messages", {"max_tokens": 5, "messages": "hello"}, 400),
    ("/v1/messages", {"max_tokens": 5}, 400),
    ("/v1/messages/count_tokens", {"messages": []}, 400),
    ("/v1/responses", {"input": "x", "instructions": ["a"], "stream": "yes"}, 200),
    ("/v1/responses", {"input": [{"type": "message", "role": "developer", "content": "be brief"},
                                 {"type": "message", "role": "user", "content": "hi"}]}, 200),
]


@pytest.mark.parametrize("route,body,status", ENGINE_JUDGES)
def test_the_engine_judges_what_the_door_passes_natively_byte_for_byte(pool, route, body, status):
    """Natively the engine's answer to a body the door passes comes back unmodified: the
    status and the very bytes the engine gives when asked directly (Claude Code's retries
    read its wording)."""
    nodes, sims = pool
    body = {"model": NATIVE, **body}
    direct = httpx.post(sims["b-llamacpp"].url + route, json=body, timeout=30)
    r = httpx.post(nodes["hub-a"].url + route, json=body, timeout=30)
    assert r.status_code == direct.status_code == status, (route, body, r.text, direct.text)
    if status >= 400:
        assert r.content == direct.content
        assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")


@pytest.mark.parametrize("route,body,status", [c for c in ENGINE_JUDGES if c[0] != "/v1/responses"
                                               or "stream" not in c[1]])
def test_the_engine_judges_what_the_door_passes_translated_in_the_dialects_shape(pool, route, body, status):
    """Translated, the same bodies reach a chat-completions engine as the mapping makes them
    (a system message in place, an unknown role a user turn); an engine's refusal comes back
    in the app's dialect with the engine's words."""
    nodes, _ = pool
    r = httpx.post(nodes["hub-a"].url + route, json={"model": TRANSLATED, **body}, timeout=30)
    if status < 400:  # what a native engine serves, the mapping serves too
        assert r.status_code == 200, (route, body, r.text)
        return
    # the chat engine judges the mapped body (an empty message list may well be served)
    assert r.status_code in (200, 400), (route, body, r.status_code, r.text)
    if r.status_code == 400:
        assert (_anthropic_shape if route.startswith("/v1/messages") else _openai_shape)(r), r.text


def test_sdk_sees_bad_input_as_its_own_error_type(pool):
    client = _claude(_entry(pool, "hop"))
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nobody-has:1b", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert "not served by this node or any connected peer" in missing.value.message
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=NATIVE, max_tokens=5, messages=[])


@pytest.mark.parametrize("route,body,fault,signature", [
    ("/v1/messages", {"max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "x"}]}, "cut",
     "truncated-upstream"),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}, "unused",
     "degenerate-output"),
    ("/v1/responses", {"input": "x", "stream": True}, "cut", "truncated-upstream"),
    ("/v1/responses", {"input": "x"}, "unused", "degenerate-output"),
])
def test_output_checks_read_each_dialects_final_event_and_text(pool, route, body, fault, signature):
    """A native Messages or Responses answer cut before message_stop / response.completed,
    or made of placeholders, is recorded as the node's fault (the last candidate's answer
    still goes to the app as the engine gave it)."""
    nodes, sims = pool
    sims["b-llamacpp"].add_fault(fault, model=NATIVE, count=1)
    r = httpx.post(nodes["hub-a"].url + route, json={"model": NATIVE, **body}, timeout=30)
    assert r.status_code == 200
    row = _row(nodes["hub-a"], r.headers["x-hub-pool-request-id"])
    assert row["outcome"] == "failed" and row["requestError"]["signature"] == signature, row
    assert row["requestError"]["basis"] == "node"


def test_status_and_plugins_say_which_dialects_each_engine_serves(pool):
    from hubpool_core.cli.status_commands import _this_node
    from hubpool_core.plugins import load_plugins

    nodes, _ = pool
    with nodes["hub-b"].client(headers=nodes["hub-b"].headers()) as c:
        status = c.get("/api/inference/pool/status").json()
    engines = {b["type"]: b for b in status["localNode"]["backends"]}
    assert engines["ollama"]["dialects"] == ["native", "openai"] and engines["ollama"]["agentDialectsKnown"]
    assert "rerank" in engines["vllm"]["dialects"]
    lines = _this_node(status)
    served = [ln.strip() for ln in lines if ln.strip().startswith("serves ")]
    assert "serves native, openai; translates messages, count-tokens, responses" in served  # Ollama 0.12.6
    assert "serves openai, count-tokens, messages, responses" in served  # llama-server
    records = {r.name: r for r in load_plugins((), []).records}
    assert records["ollama"].dialects == ["native,openai · agent by version"]
    assert records["llamacpp"].dialects == ["openai · agent by probe"]
    assert records["lemonade"].dialects == ["openai · agent translated"]


def test_metrics_and_the_routing_log_name_the_agent_routes(pool):
    nodes, _ = pool
    a = nodes["hub-a"]
    turn = [{"role": "user", "content": "x"}]
    for route, body in (("/v1/messages", {"model": NATIVE, "max_tokens": 2, "messages": turn}),
                        ("/v1/messages/count_tokens", {"model": NATIVE, "messages": turn}),
                        ("/v1/responses", {"model": NATIVE, "input": "x"}),
                        ("/rerank", {"model": RERANKER, "query": "q", "documents": ["d"]})):
        r = httpx.post(a.url + route, json=body)
        assert r.status_code == 200, r.text
        assert _row(a, r.headers["x-hub-pool-request-id"])["path"] == ("/v1/rerank" if route == "/rerank" else route)
    with a.client(headers=a.headers()) as c:
        text = c.get("/metrics").text
    for route in ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/rerank"):
        assert f'route="{route}"' in text, route


@pytest.mark.parametrize("model,engine", [(NATIVE, "b-llamacpp"), (TRANSLATED, "b-ollama")],
                         ids=["native", "translated"])
def test_an_engines_verdict_on_the_request_comes_back_in_the_dialects_shape(pool, model, engine):
    """spec: "A request no node can serve" — a 500 "no user query" is returned at once as a
    400 with X-Hub-Pool-Upstream-Status: 500, in the Messages error shape either way."""
    nodes, sims = pool
    sims[engine].add_fault("verdict:no-user-query", model=model, count=1)
    r = httpx.post(nodes["hub-a"].url + "/v1/messages", json={
        "model": model, "max_tokens": 4, "messages": [{"role": "assistant", "content": "no user turn"}]})
    assert r.status_code == 400 and r.headers["x-hub-pool-upstream-status"] == "500"
    body = r.json()
    message = body["error"]["message"]
    assert "no user query found in messages" in message.lower()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    row = _row(nodes["hub-a"], r.headers["x-hub-pool-request-id"])
    assert row["requestError"]["signature"] == "no-user-query" and row["requestError"]["basis"] == "definitive"


def test_sessions_come_from_the_configured_sources_hashed(pool):
    """Codex's session-id header, spelled with an underscore here as some releases send it,
    names the session (the default list compares - and _ alike), and the list is the
    operator's: a header of their own works, a bad entry is refused."""
    nodes, _ = pool
    a = nodes["hub-a"]
    settings = "/api/inference/pool/settings"
    with a.client(headers=a.headers()) as c:
        assert c.patch(settings, json={"poolPrefixAffinityMaxInFlight": 2}).status_code == 200
        try:
            rows = []
            for _ in range(2):
                r = httpx.post(a.url + "/v1/responses", json={"model": NATIVE, "input": "x"},
                               headers={"session_id": "codex-session-7f3a"})
                rows.append(_row(a, r.headers["x-hub-pool-request-id"])["affinity"])
            assert [s["keySource"] for s in rows] == ["session-id", "session-id"]
            assert [s["outcome"] for s in rows] == ["miss", "hit"] and rows[0]["key"] == "header"
            assert "codex-session-7f3a" not in str(c.get("/api/inference/pool/routing-log?limit=20").json())
            assert c.patch(settings, json={"poolSessionSources": ["header:x-my-run"]}).status_code == 200
            r = httpx.post(a.url + "/v1/responses", json={"model": NATIVE, "input": "x"},
                           headers={"x-my-run": "run-1", "session_id": "ignored-now"})
            assert _row(a, r.headers["x-hub-pool-request-id"])["affinity"]["keySource"] == "x-my-run"
            bad = c.patch(settings, json={"poolSessionSources": ["cookie:sid"]})
            assert bad.status_code == 422, bad.text
        finally:
            c.patch(settings, json={"poolPrefixAffinityMaxInFlight": 0,
                                    "poolSessionSources": list(DEFAULT_SESSION_SOURCES)})
