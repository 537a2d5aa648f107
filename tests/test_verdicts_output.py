"""Requests no node can serve, 200s that are not answers, and withholding — the spec's
fleet stories replayed on simulated engines through real nodes."""

from __future__ import annotations

import json
import socket
import time
from contextlib import ExitStack

import httpx
import pytest
from harness import RunningNode, fqdn, make_pool, pair, poll_until_offered
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


def test_a_blackholed_engine_costs_one_short_read_per_ttl(tmp_path):
    """spec: a firewall that drops the SYN held every request for the 5 s probe timeout."""
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
