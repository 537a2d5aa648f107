"""Requests no node can serve, 200s that are not answers, and withholding — the spec's
fleet stories replayed on simulated engines through real nodes."""

from __future__ import annotations

import json
import logging
import socket
import time
from contextlib import ExitStack

import httpx
import pytest
from aiohttp import web
from aiohttp_thread import ThreadedApp
from harness import RunningNode, fqdn, make_pool, name_of, pair, poll_until_offered
from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.placement import Candidate, PlacementContext, run_stages
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
NO_USER = {"model": "qwen3:8b", "stream": False, "messages": [{"role": "system", "content": "you are terse"}]}


def op(node, method, path, body=None):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert r.status_code < 400, r.text
    return r.json()


def row_of(node, rid):
    return next(e for e in op(node, "GET", "/routing-log?limit=500")["entries"] if e["id"] == rid)


@pytest.fixture
def trio(tmp_path):
    """Three nodes, each with a simulated vLLM holding qwen3:8b; hub-a pairs with both."""
    with ExitStack() as stack:
        sims = {n: stack.enter_context(run_in_thread(SimConfig(flavor="vllm", models=[SimModel("qwen3:8b",
                                                                                                window=8192)])))
                for n in ("hub-a", "hub-b", "hub-c")}
        nodes = make_pool(tmp_path, list(sims), per_node={n: {"VLLM_URL": s.url} for n, s in sims.items()})
        for n in nodes.values():
            n.start()
        a = nodes["hub-a"]
        for other in ("hub-b", "hub-c"):
            pair(a, nodes[other])
        poll_until_offered(a, [nodes["hub-b"], nodes["hub-c"]], "qwen3:8b")
        yield nodes, sims
        for n in nodes.values():
            n.stop()


def test_a_turn_with_no_user_message_returns_the_engines_body_at_once(trio):
    """spec: 2026-09-26, one turn walked nine candidates for 307 s before a 502."""
    nodes, sims = trio
    for sim in sims.values():
        sim.add_fault("verdict:no-user-query", count=5)
    r = httpx.post(nodes["hub-a"].url + "/v1/chat/completions", json=NO_USER)
    assert r.status_code == 400
    assert r.headers["x-hub-pool-upstream-status"] == "500"
    assert "No user query found in messages." in r.text  # the engine's own words
    row = row_of(nodes["hub-a"], r.headers["x-hub-pool-request-id"])
    assert row["attempt"] == 1 and row["failedOverFrom"] == []
    assert row["requestError"] == {"signature": "no-user-query", "basis": "definitive", "confirms": None}
    assert row["outcome"] == "failed" and row["status"] == 500
    assert sum(s.stats()["faults_served"] for s in sims.values()) == 1
    summary = op(nodes["hub-a"], "GET", "/routing-log")["summary"]
    assert summary["requestErrors"] == 1


def test_a_lone_node_missing_content_returns_that_message_not_a_502(tmp_path):
    """spec: until 2026-09-29 a single llama-server's 'Missing content' became a bare 502."""
    cfg = SimConfig(flavor="llamacpp", models=[SimModel("gemma3:4b", window=4096)])
    with run_in_thread(cfg) as sim, RunningNode(tmp_path / "n", {"LLAMACPP_URL": sim.url}) as node:
        sim.add_fault("verdict:invalid-message", count=1)
        r = httpx.post(node.url + "/v1/chat/completions",
                       json={"model": "gemma3:4b", "messages": [{"role": "user"}]})
        assert r.status_code == 400 and "Missing 'content' in message" in r.text
        row = row_of(node, r.headers["x-hub-pool-request-id"])
        assert row["requestError"]["basis"] == "last-candidate"


def test_a_malformed_message_is_confirmed_by_the_next_candidate(trio):
    nodes, sims = trio
    for sim in sims.values():
        sim.add_fault("verdict:invalid-message", count=1)
    r = httpx.post(nodes["hub-a"].url + "/v1/chat/completions", json={**NO_USER, "messages": [{"role": "user"}]})
    assert r.status_code == 400
    row = row_of(nodes["hub-a"], r.headers["x-hub-pool-request-id"])
    assert row["requestError"]["basis"] == "confirmed" and row["attempt"] == 2
    assert row["requestError"]["confirms"] == "local"


def test_a_template_that_would_not_render_keeps_its_500(tmp_path):
    cfg = SimConfig(flavor="vllm", models=[SimModel("m:8b")])
    with run_in_thread(cfg) as sim, RunningNode(tmp_path / "n", {"VLLM_URL": sim.url}) as node:
        sim.add_fault("verdict:chat-template", count=1)
        r = httpx.post(node.url + "/v1/chat/completions", json={"model": "m:8b", "messages": [{"role": "user",
                                                                                             "content": "x"}]})
        assert r.status_code == 500 and "x-hub-pool-upstream-status" not in r.headers
        assert "chat template" in r.text.lower()


def test_a_500_that_is_no_verdict_still_fails_over(trio):
    nodes, sims = trio
    sims["hub-a"].add_fault("error:500", count=1)
    r = httpx.post(nodes["hub-a"].url + "/v1/chat/completions",
                   json={"model": "qwen3:8b", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] != "local"


def test_the_unused49_engine_is_withheld_after_two_faults_and_retries_go_elsewhere(trio):
    """spec: 2026-09-29, core-2's gemma answered nothing but <unused49> and kept getting retries."""
    nodes, sims = trio
    a = nodes["hub-a"]
    sims["hub-a"].add_fault("unused", count=100)
    served = []
    for _ in range(3):
        r = httpx.post(a.url + "/api/chat", json={"model": "qwen3:8b", "stream": False,
                                                  "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200 and "<unused" not in r.text
        served.append((r.headers["x-hub-pool-served-by"], row_of(a, r.headers["x-hub-pool-request-id"])))
    assert all(node != "local" for node, _ in served)
    assert served[0][1]["attempts"][0]["reason"] == "degenerate-output"
    assert served[1][1]["attempts"][0]["reason"] == "degenerate-output"
    assert served[2][1]["failedOverFrom"] == []  # withheld: moved behind every other candidate
    assert served[2][1]["attempt"] == 1 and served[2][1]["candidates"] == 3  # still a candidate, only last


def test_a_cut_stream_is_recorded_truncated_and_never_given_an_ending(tmp_path):
    cfg = SimConfig(flavor="ollama", models=[SimModel("m:1b")])
    with run_in_thread(cfg) as sim, RunningNode(tmp_path / "n", {"OLLAMA_URL": sim.url}) as node:
        sim.add_fault("cut", count=1)
        turn = [{"role": "user", "content": "tell me"}]
        with httpx.stream("POST", node.url + "/api/chat", json={"model": "m:1b", "messages": turn}) as r:
            lines = [json.loads(x) for x in r.iter_lines() if x]
            rid = r.headers["x-hub-pool-request-id"]
        assert lines and lines[-1]["done"] is False
        row = row_of(node, rid)
        assert row["outcome"] == "failed"
        assert row["requestError"] == {"signature": "truncated-upstream", "basis": "node", "confirms": None}
        assert op(node, "GET", "/routing-log")["summary"]["outputFaults"] == 1
        sim.add_fault("drop", count=1)
        with httpx.stream("POST", node.url + "/v1/chat/completions",
                          json={"model": "m:1b", "stream": True, "messages": turn}) as r:
            try:
                body = b"".join(r.iter_raw())
            except httpx.HTTPError:
                body = b""
            rid = r.headers["x-hub-pool-request-id"]
        assert b"[DONE]" not in body
        assert row_of(node, rid)["requestError"]["signature"] == "truncated-upstream"


def test_a_blackholed_engine_costs_one_short_read_per_ttl(tmp_path, caplog):
    """spec: a firewall that drops the SYN held every request for the 5 s probe timeout. Issue
    16.9: listings ask only the engines the snapshot calls healthy, so they do not wait either."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # accepts into the backlog, never answers
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    try:
        with run_in_thread(SimConfig(flavor="ollama", models=[SimModel("m:1b")])) as sim, \
                RunningNode(tmp_path / "n", {"OLLAMA_URL": sim.url, "VLLM_URL": url}) as node:
            op(node, "PATCH", "/settings", {"poolProbeSnapshotTtlMs": 10_000})
            timings = []
            for _ in range(4):
                started = time.monotonic()
                r = httpx.post(node.url + "/api/chat", json={"model": "m:1b", "stream": False, "messages": []})
                timings.append(time.monotonic() - started)
                assert r.status_code == 200
            assert timings[0] < 2.0  # the cold read waits at most the 500 ms placement budget
            assert max(timings[1:]) < 0.5  # and then costs nothing within the TTL
            r = httpx.post(node.url + "/api/chat", json={"model": "nope", "stream": False, "messages": []})
            vllm = next(b for b in r.json()["localBackends"] if b["type"] == "vllm")
            assert vllm["running"] is False and "placement budget" in vllm["error"]
            caplog.set_level(logging.DEBUG, logger="hubpool.engines")
            for route, key, field in (("/v1/models", "data", "id"), ("/api/tags", "models", "name")):
                started = time.monotonic()
                listed = httpx.get(node.url + route)
                waited = time.monotonic() - started
                assert listed.status_code == 200 and "m:1b" in {m[field] for m in listed.json()[key]}
                assert waited < 2.0  # the 2.5 s listing deadline was not waited out
            assert "listing left out vllm" not in caplog.text  # the unhealthy engine was never asked
    finally:
        hole.close()


@given(st.lists(st.booleans(), min_size=1, max_size=8))
def test_withheld_engines_are_never_removed_only_last(flags):
    cands = [Candidate(f"n{i}", "vllm") for i in range(len(flags))]
    withheld = {id(c) for c, f in zip(cands, flags) if f}
    ctx = PlacementContext(route="/api/chat", route_class="chat", model="m", body={}, estimated_tokens=1,
                           settings=None)
    ordered, sections = run_stages([], cands, ctx, [], withheld=lambda c: id(c) in withheld)
    assert sorted(map(id, ordered)) == sorted(map(id, cands))
    assert [id(c) in withheld for c in ordered] == sorted(flags)  # all kept, the withheld at the end
    assert sections == {"pin": None}




def test_a_burst_of_faults_is_one_event_and_two_events_withhold():
    from hubpool_core.placement.quarantine import Quarantine

    now = [1000.0]
    q = Quarantine(clock=lambda: now[0])
    key = ("hub-b.example.ts.net", "vllm", "m")
    cut = "truncated-upstream (connection dropped)"
    assert [q.strike(key, cut) for _ in range(14)] == [False] * 14  # one kill, 14 cut streams
    assert not q.withheld(key)
    now[0] += 30
    assert q.strike(key, cut) is True  # a second event within five minutes
    assert q.withheld(key)
    now[0] += 61
    assert not q.withheld(key)
    assert q.strike(key, "degenerate-output") is True  # the re-probe failed: withheld again, doubled
    now[0] += 61
    assert q.withheld(key)
    q.clear(key)
    assert not q.withheld(key)


def test_a_model_failing_to_load_is_withheld_and_released_when_resident(tmp_path):
    """spec: core-4 listed gemma3:1b and answered every generate with 500 'model failed to load'."""
    cfg = SimConfig(flavor="ollama", models=[SimModel("gemma3:1b"), SimModel("other:1b")])
    with run_in_thread(cfg) as sim, RunningNode(tmp_path / "n", {"OLLAMA_URL": sim.url}) as node:
        sim.add_fault("error:500", model="gemma3:1b", count=2)
        body = {"model": "gemma3:1b", "stream": False, "messages": [{"role": "user", "content": "x"}]}
        for _ in range(2):
            assert httpx.post(node.url + "/api/chat", json=body).status_code == 502
        r = httpx.post(node.url + "/api/chat", json=body)
        assert r.status_code == 502 and r.json()["error"].startswith('No pool node currently has model "gemma3:1b"')
        with node.client() as c:
            caps_models = {m["name"] for m in c.get("/api/tags").json()["models"]}
        assert "gemma3:1b" in caps_models  # the on-disk inventory still lists it
        assert node.node.unservable.withheld_models("local", "ollama") == {"gemma3:1b"}
        httpx.post(sim.url + "/api/generate", json={"model": "gemma3:1b", "prompt": "load", "stream": False})
        node.run(node.node.health.poll_once())  # resident in /api/ps: proof it serves
        assert node.node.unservable.withheld_models("local", "ollama") == set()
        assert httpx.post(node.url + "/api/chat", json=body).status_code == 200


def _native_stream(node, content="tell me", model="qwen3:8b"):
    """A streamed native /api/chat: its NDJSON lines and the request id."""
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    with httpx.stream("POST", node.url + "/api/chat", json=body, timeout=30) as r:
        assert r.status_code == 200
        return [json.loads(x) for x in r.iter_lines() if x], r.headers["x-hub-pool-request-id"]


def test_a_translated_stream_is_judged_at_the_entry_and_at_the_leaf(trio):
    """Issue 16.1: native /api/chat on an OpenAI-only engine goes through the translator, and
    its stream is judged from the engine's own bytes, exactly as an untranslated one."""
    nodes, sims = trio
    a, b = nodes["hub-a"], nodes["hub-b"]
    local_vllm = ("local", "vllm", "qwen3:8b")
    # entry node, its own vLLM: placeholders only, in a turn long enough to be timed
    sims["hub-a"].add_fault("unused", count=2)
    long_turn = "word " * 4000  # ~20 KB: over the 4,096 estimated tokens a sample needs
    for i in range(2):
        lines, rid = _native_stream(a, long_turn)
        assert "<unused49>" in lines[0]["message"]["content"]  # a stream cannot be recalled
        row = row_of(a, rid)
        assert row["node"] == "local" and row["backend"] == "vllm"
        assert row["outcome"] == "failed" and row["reason"] == "degenerate-output"
        assert row["requestError"] == {"signature": "degenerate-output", "basis": "node", "confirms": None}
    assert a.node.output_quarantine.withheld(local_vllm)  # two faults withhold it
    assert op(a, "GET", "/status")["localNode"]["throughput"] == []  # a failed answer is no sample
    assert op(a, "GET", "/routing-log")["summary"]["outputFaults"] == 2
    lines, rid = _native_stream(a)  # withheld: the next turn goes to a peer
    assert row_of(a, rid)["node"] != "local" and lines[-1]["done"] is True
    a.node.output_quarantine.clear(local_vllm)
    # a translated stream cut before its final frame: no closing frame, recorded truncated
    sims["hub-a"].add_fault("cut", count=1)
    lines, rid = _native_stream(a)
    assert lines and lines[-1]["done"] is False
    assert row_of(a, rid)["requestError"]["signature"] == "truncated-upstream"
    # a leaf serving a forward translates too, and strikes its own engine on what it judged
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-b")).id})
    sims["hub-b"].add_fault("unused", count=2)
    for _ in range(2):
        lines, rid = _native_stream(a)
        assert row_of(a, rid)["node"] == fqdn("hub-b")
    assert b.node.output_quarantine.withheld(local_vllm)  # the leaf's own apps stop using it
    op(a, "DELETE", "/pins?scope=default")


#: a chunk whose choices is an object, not a list: malformed, with a finish_reason inside
_ODD_FINAL = b'data: {"choices": {"0": {"finish_reason": "stop"}}, "finish_reason": "stop"}\n\n'


def _odd_vllm() -> web.Application:
    """A vLLM-shaped engine whose streams end on a chunk with a non-list ``choices``."""
    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "odd:8b", "object": "model",
                                                               "owned_by": "vllm", "max_model_len": 8192}]})

    async def chat(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"index": 0, "delta": {"content": "hello"}}]}\n\n')
        await resp.write(_ODD_FINAL)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def test_a_chunk_whose_choices_is_not_a_list_is_judged_not_a_crash(tmp_path):
    """Engine.is_final_frame raised on a non-list ``choices``: the pump died mid-stream. The
    frame is judged (no final frame: cut) and the app's stream ends properly, in both dialects."""
    with ThreadedApp(_odd_vllm()) as engine, RunningNode(tmp_path / "n", {"VLLM_URL": engine.url}) as node:
        turn = [{"role": "user", "content": "x"}]
        with httpx.stream("POST", node.url + "/v1/chat/completions",
                          json={"model": "odd:8b", "stream": True, "messages": turn}) as r:
            body = b"".join(r.iter_raw())
            rid = r.headers["x-hub-pool-request-id"]
        assert _ODD_FINAL.strip() in body  # passed through whole
        row = row_of(node, rid)
        assert row["outcome"] == "failed" and row["totalMs"] is not None
        assert row["requestError"] == {"signature": "truncated-upstream", "basis": "node", "confirms": None}
        lines, rid = _native_stream(node, model="odd:8b")  # translated: the same judgement
        assert lines[0]["message"]["content"] == "hello" and lines[-1]["done"] is False
        assert row_of(node, rid)["requestError"]["signature"] == "truncated-upstream"


def _offered(entry, leaf, model="qwen3:8b"):
    """Whether ``leaf`` offers ``model`` on its vLLM to ``entry`` at its next health poll."""
    entry.run(entry.node.health.poll_once())
    peer = next(p for p in op(entry, "GET", "/status")["peers"] if p["nodeFqdn"] == name_of(leaf))
    engine = next(b for b in peer["lastCapabilities"]["backends"] if b["type"] == "vllm")
    return model in engine["modelsLoaded"]


def test_a_leaf_withholds_a_model_its_engine_fails_on_forwards(trio):
    """Issue 16.2, spec "When a node lists a model it cannot actually serve": a peer corrects
    its own capabilities. A verdict on the request is not the model's fault and strikes nothing."""
    nodes, sims = trio
    a, b = nodes["hub-a"], nodes["hub-b"]
    op(a, "POST", "/pins", {"scope": "model", "model": "qwen3:8b", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-b")).id})
    body = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "x"}]}
    sims["hub-b"].add_fault("verdict:invalid-message", count=2)
    for _ in range(2):
        r = httpx.post(a.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200  # another engine answered
        row = row_of(a, r.headers["x-hub-pool-request-id"])
        assert row["attempts"][0]["reason"] == "HTTP 500 (invalid-message)"  # the leaf relayed the body
    assert _offered(a, b)
    sims["hub-b"].add_fault("error:500", count=2)
    for _ in range(2):
        r = httpx.post(a.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] != fqdn("hub-b")
    assert not _offered(a, b)
    op(a, "DELETE", "/pins?scope=model&model=qwen3:8b")


def test_a_leaf_records_why_a_forward_failed_but_never_judges_the_request(trio):
    """Issue 16.5, spec (routing log): requestError is always null inbound; the entry judges the
    request and the output, so the leaf's summary counts neither for work it only served."""
    nodes, sims = trio
    a, b = nodes["hub-a"], nodes["hub-b"]
    op(a, "POST", "/pins", {"scope": "model", "model": "qwen3:8b", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-b")).id})
    body = {"model": "qwen3:8b", "stream": False, "messages": [{"role": "user", "content": "x"}]}
    sims["hub-b"].add_fault("error:400", count=1)
    r = httpx.post(a.url + "/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    rid = r.headers["x-hub-pool-request-id"]
    assert row_of(a, rid)["requestError"] == {"signature": "client-error", "basis": "status", "confirms": None}
    inbound = row_of(b, rid)
    assert inbound["direction"] == "inbound" and inbound["outcome"] == "failed" and inbound["status"] == 400
    assert inbound["requestError"] is None
    sims["hub-b"].add_fault("unused", count=1)
    r = httpx.post(a.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] != fqdn("hub-b")  # failed over
    rid = r.headers["x-hub-pool-request-id"]
    assert row_of(a, rid)["attempts"][0]["reason"] == "degenerate-output"
    inbound = row_of(b, rid)
    assert inbound["outcome"] == "failed" and inbound["reason"] == "degenerate-output"
    assert inbound["requestError"] is None
    summary = op(b, "GET", "/routing-log")["summary"]
    assert summary["requestErrors"] == 0 and summary["outputFaults"] == 0 and summary["failed"] == 2
    op(a, "DELETE", "/pins?scope=model&model=qwen3:8b")


@pytest.fixture
def mixed(tmp_path):
    """hub-a runs a vLLM (m:8b at 8192) and a llama-server (m:8b at 16384); hub-b, paired, a
    Lemonade holding m:8b. Four engine kinds none of which renders its own template."""
    with ExitStack() as stack:
        def sim(flavor, window):
            return stack.enter_context(run_in_thread(SimConfig(flavor=flavor, models=[SimModel("m:8b",
                                                                                               window=window)])))
        sims = {"vllm": sim("vllm", 8192), "llamacpp": sim("llamacpp", 16384), "lemonade": sim("lemonade", 8192)}
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={
            "hub-a": {"VLLM_URL": sims["vllm"].url, "LLAMACPP_URL": sims["llamacpp"].url},
            "hub-b": {"LEMONADE_URL": sims["lemonade"].url}})
        for n in nodes.values():
            n.start()
        pair(nodes["hub-a"], nodes["hub-b"])
        poll_until_offered(nodes["hub-a"], [nodes["hub-b"]], "m:8b")
        yield nodes, sims
        for n in nodes.values():
            n.stop()


def _refused(node):
    """One chat turn for m:8b at ``node``: (the response, its routing-log row)."""
    r = httpx.post(node.url + "/v1/chat/completions",
                   json={"model": "m:8b", "messages": [{"role": "user", "content": "x"}]})
    return r, row_of(node, r.headers["x-hub-pool-request-id"])


def test_the_verdict_walk_compares_engine_kinds_and_windows(mixed):
    """Issue 16.6 and 16.7 (spec: "A request no node can serve"): a malformed message refused by
    llama.cpp and vLLM still reaches the Lemonade ahead; a prompt too long is confirmed only at
    the same window; a new signature replaces the pending one."""
    nodes, sims = mixed
    a = nodes["hub-a"]
    for s in sims.values():
        s.add_fault("verdict:invalid-message", count=1)
    r, row = _refused(a)
    assert {x["backend"] for x in row["attempts"]} == {"vllm", "llamacpp"}
    assert r.status_code == 400 and row["node"] == fqdn("hub-b")  # the third kind was asked: it refused too
    assert row["requestError"]["basis"] == "confirmed" and row["attempt"] == 3
    sims["lemonade"].clear_faults()
    for kind in ("vllm", "llamacpp"):
        sims[kind].add_fault("verdict:invalid-message", count=1)
    r, row = _refused(a)
    assert r.status_code == 200 and row["node"] == fqdn("hub-b")  # not a confirmed 400 from two local kinds
    # a prompt too long: hub-a's engines run 8192 and 16384, so neither confirms the other
    op(a, "POST", f"/peers/{fqdn('hub-b')}/disable")
    for kind in ("vllm", "llamacpp"):
        sims[kind].add_fault("verdict:context-length", count=1)
    r, row = _refused(a)
    assert r.status_code == 400 and row["attempt"] == 2
    assert row["requestError"] == {"signature": "context-length", "basis": "last-candidate", "confirms": None}
    op(a, "POST", f"/peers/{fqdn('hub-b')}/enable")
    # invalid-message, then context-length, then invalid-message: the second replaced the first
    first = row["attempts"][0]["backend"]
    second = "llamacpp" if first == "vllm" else "vllm"
    sims[first].add_fault("verdict:invalid-message", count=1)
    sims[second].add_fault("verdict:context-length", count=1)
    sims["lemonade"].add_fault("verdict:invalid-message", count=1)
    r, row = _refused(a)
    assert r.status_code == 400 and row["node"] == fqdn("hub-b")
    assert row["requestError"] == {"signature": "invalid-message", "basis": "last-candidate", "confirms": None}


def test_a_long_placeholder_answer_is_caught_failed_over_withheld_and_never_a_speed_sample(tmp_path):
    """Issue 26.10: the head is cut at 256 characters, which cuts the 26th <unused49> in half;
    a full match then missed every answer longer than ~25 placeholders. Sixty reached the app
    as a served 200, never failed over, never withheld the engine and fed a speed sample."""
    with ExitStack() as stack:
        sims = {flavor: stack.enter_context(run_in_thread(SimConfig(flavor=flavor, models=[SimModel("m:8b")])))
                for flavor in ("ollama", "vllm")}
        node = stack.enter_context(RunningNode(tmp_path / "n", {"OLLAMA_URL": sims["ollama"].url,
                                                                 "VLLM_URL": sims["vllm"].url}))
        for sim in sims.values():
            sim.add_fault("unused", count=3)
        turn = [{"role": "user", "content": "x"}]
        for _ in range(2):  # non-streamed: judged whole, failed over, the last one relayed as it came
            r = httpx.post(node.url + "/v1/chat/completions", timeout=30,
                           json={"model": "m:8b", "max_tokens": 60, "messages": turn})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "<unused49>" * 60
            row = row_of(node, r.headers["x-hub-pool-request-id"])
            assert row["outcome"] == "failed" and row["attempts"][0]["reason"] == "degenerate-output", row
            assert row["requestError"] == {"signature": "degenerate-output", "basis": "node", "confirms": None}
        withheld = [k for k in ("ollama", "vllm") if node.node.output_quarantine.withheld(("local", k, "m:8b"))]
        assert withheld == ["ollama", "vllm"]  # two faults each within five minutes
        # the stream's own loop guard (issue 28) would end sixty identical spans first: this is
        # about the output judge, which also reads streams whose placeholders differ
        op(node, "PATCH", "/settings", {"poolStreamLoopGuard": 0})
        with httpx.stream("POST", node.url + "/v1/chat/completions", timeout=30,
                          json={"model": "m:8b", "max_tokens": 60, "stream": True, "messages": turn}) as s:
            assert s.status_code == 200 and b"".join(s.iter_raw()).count(b"<unused49>") == 60
            rid = s.headers["x-hub-pool-request-id"]
        assert row_of(node, rid)["requestError"]["signature"] == "degenerate-output"  # judged on the way past
        local = op(node, "GET", "/status")["localNode"]
        assert local["speed"] == [] and local["throughput"] == []  # no answer here was a sample
