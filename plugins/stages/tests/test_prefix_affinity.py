"""Prefix affinity: the session key, the table, the move to the front and the section."""

from __future__ import annotations

import hashlib

import pytest
from hubpool_stages import affinity as affinity_module
from hubpool_stages.affinity import (
    HEADER,
    MAX_KEYS,
    AffinityTable,
    PrefixAffinityStage,
    prompt_head,
    session_key,
    ttl_ms_from,
)
from hubpool_stages.contention import LocalContentionStage
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.placement import run_stages
from hubpool_core.stage import PIN_ORDER


def stage_for(build, node=None):
    return PrefixAffinityStage(node if node is not None else build.node())


def place(stage, ctx, ranking):
    """apply, then the walk tries the first candidate: what the core does per request."""
    out, section = stage.apply(ranking, ctx)
    stage.placed(ctx, out[0])
    return out, section


def test_order_and_names_place_it_first_and_before_the_pin():
    assert (PrefixAffinityStage.name, PrefixAffinityStage.section) == ("prefix_affinity", "affinity")
    assert PrefixAffinityStage.order == 100 < LocalContentionStage.order < PIN_ORDER


def test_enabled_only_with_a_limit_on_a_judged_route(build):
    stage = stage_for(build)
    assert not stage.enabled(build.context(cfg=build.settings(limit=0, margin=3)))  # a margin alone does nothing
    assert stage.enabled(build.context(cfg=build.settings(limit=2)))
    for route in ("/v1/chat/completions", "/v1/completions", "/api/generate"):
        assert stage.enabled(build.context(route, {"prompt": "x"}, cfg=build.settings(limit=2)))
    assert not stage.enabled(build.context("/v1/embeddings", {"input": "x"}, cfg=build.settings(limit=2)))


def test_first_call_misses_and_the_next_follows_to_the_peer_it_went_to(build):
    stage = stage_for(build, build.node(local_in_flight=0))
    cfg = build.settings(limit=2)
    ranking = [build.local(), build.peer("b.ts.net", in_flight=0)]
    first = build.context(cfg=cfg, session="chat-1")
    out, section = stage.apply(ranking, first)
    assert section["outcome"] == "miss" and section["remembered"] is None and section["key"] == "header"
    assert first.response_headers[HEADER] == "miss"
    stage.placed(first, ranking[1])  # say a pin sent the first call to the peer
    second = build.context(cfg=cfg, session="chat-1")
    out, section = place(stage, second, ranking)
    assert build.nodes(out) == [("b.ts.net", "ollama"), ("local", "ollama")]
    assert section == {"key": "header", "keySource": "X-Hub-Pool-Session", "outcome": "hit", "qualified": True,
                       "remembered": "b.ts.net",
                       "inFlight": 0, "leastLoadedInFlight": 0, "maxInFlight": 2, "affinityMargin": 0}
    assert second.response_headers[HEADER] == "hit"


def test_the_limit_counts_the_request_being_placed(build):
    stage = stage_for(build)
    cfg = build.settings(limit=2)
    for in_flight, qualified in ((0, True), (1, True), (2, False), (5, False)):
        ranking = [build.local(), build.peer("b", in_flight=in_flight)]
        stage.table.remember("k", "b", "ollama")
        ctx = build.context(cfg=cfg)
        ctx.scratch[affinity_module.SCRATCH_SESSION] = ("header", "k")
        out, section = stage.apply(ranking, ctx)
        assert section["qualified"] is qualified, in_flight
        assert section["outcome"] == ("hit" if qualified else "skipped")
        assert (out[0].node == "b") is qualified


def test_the_margin_widens_the_limit_until_the_hard_stop(build):
    stage = stage_for(build, build.node(local_in_flight=0))
    for remembered, least, margin, qualified in ((3, 2, 1, True), (4, 2, 1, False), (3, 3, 0, False),
                                                 (19, 18, 1, True), (20, 19, 1, False), (20, 20, 5, False)):
        ranking = [build.peer("x", in_flight=least), build.peer("r", in_flight=remembered)]
        stage.table.remember("k", "r", "ollama")
        ctx = build.context(cfg=build.settings(limit=2, margin=margin))
        ctx.scratch[affinity_module.SCRATCH_SESSION] = ("hashed", "k")
        _, section = stage.apply(ranking, ctx)
        assert section["qualified"] is qualified, (remembered, least, margin)
        assert section["leastLoadedInFlight"] == least and section["inFlight"] == remembered


def test_the_local_queue_is_this_nodes_own_count(build):
    stage = stage_for(build, build.node(local_in_flight=3))
    stage.table.remember("k", "local", "ollama")
    ranking = [build.peer("b", in_flight=0), build.local(in_flight=0)]
    ctx = build.context(cfg=build.settings(limit=2))
    ctx.scratch[affinity_module.SCRATCH_SESSION] = ("header", "k")
    out, section = stage.apply(ranking, ctx)
    assert section["inFlight"] == 3 and not section["qualified"] and out[0].node == "b"


def test_a_hit_the_ranker_made_is_unqualified(build):
    # spec: 2026-09-29 fleet test, one in flight against a limit of 1, read as affinity working
    stage = stage_for(build, build.node(local_in_flight=1))
    stage.table.remember("k", "local", "ollama")
    ranking = [build.local(in_flight=1), build.peer("b", in_flight=1)]
    ctx = build.context(cfg=build.settings(limit=1))
    ctx.scratch[affinity_module.SCRATCH_SESSION] = ("header", "k")
    out, section = place(stage, ctx, ranking)
    assert out == ranking and section["outcome"] == "hit" and section["qualified"] is False


def test_a_remembered_node_that_is_no_longer_a_candidate_is_a_miss_naming_it(build):
    stage = stage_for(build)
    stage.table.remember("k", "gone.ts.net", "vllm")
    ranking = [build.local(), build.peer("b")]
    ctx = build.context(cfg=build.settings(limit=2))
    ctx.scratch[affinity_module.SCRATCH_SESSION] = ("hashed", "k")
    out, section = stage.apply(ranking, ctx)
    assert out == ranking
    assert (section["outcome"], section["remembered"], section["inFlight"]) == ("miss", "gone.ts.net", None)


def test_same_node_other_engine_is_not_the_remembered_candidate(build):
    stage = stage_for(build)
    stage.table.remember("k", "local", "llamacpp")
    ranking = [build.peer("b"), build.local("ollama")]
    ctx = build.context(cfg=build.settings(limit=2))
    ctx.scratch[affinity_module.SCRATCH_SESSION] = ("hashed", "k")
    assert stage.apply(ranking, ctx)[1]["outcome"] == "miss"


def test_a_later_step_putting_another_node_first_reads_skipped_qualified(build):
    stage = stage_for(build)
    cfg = build.settings(limit=2)
    ranking = [build.local(), build.peer("b")]
    stage.table.remember("k", "b", "ollama")
    ctx = build.context(cfg=cfg)
    ctx.scratch[affinity_module.SCRATCH_SESSION] = ("header", "k")
    _, section = stage.apply(ranking, ctx)
    assert section["outcome"] == "hit"
    stage.placed(ctx, ranking[0])  # a pin (or contention) put local first after all
    assert section["outcome"] == "skipped" and section["qualified"] is True
    assert ctx.response_headers[HEADER] == "skipped"
    assert stage.table.get("k") == ("local", "ollama")  # remembered where it was placed


def test_failover_overwrites_and_exhaustion_forgets(build):
    stage = stage_for(build)
    ranking = [build.local(), build.peer("b"), build.peer("c")]
    ctx = build.context(cfg=build.settings(limit=2), session="s")
    place(stage, ctx, ranking)
    key = ctx.scratch["affinity_key"]
    assert stage.table.get(key) == ("local", "ollama")
    stage.failed_over(ctx, ranking[2])
    assert stage.table.get(key) == ("c", "ollama")
    stage.exhausted(ctx)
    assert stage.table.get(key) is None


def test_observers_do_nothing_for_a_request_the_stage_did_not_key(build):
    stage = stage_for(build)
    ctx = build.context(cfg=build.settings(limit=2))
    stage.placed(ctx, build.local())
    stage.failed_over(ctx, build.local())
    stage.exhausted(ctx)
    assert len(stage.table) == 0


def test_a_body_with_no_head_and_no_header_has_no_key(build):
    stage = stage_for(build)
    ctx = build.context(body={"model": "m", "messages": []}, cfg=build.settings(limit=2))
    ranking = [build.local(), build.peer("b")]
    assert stage.apply(ranking, ctx) == (ranking, None)
    assert HEADER not in ctx.response_headers and "affinity_key" not in ctx.scratch


# -- the key -----------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are an agent. " + "Tools: ... " * 8000}  # ~25k tokens


def chat_ctx(build, messages, model="qwen3.6:35b", session=None, route="/api/chat"):
    return build.context(route, {"model": model, "messages": messages}, model=model, session=session,
                         cfg=build.settings(limit=8))


def test_six_sessions_sharing_one_system_prompt_get_six_keys(build):
    # spec: core-2 2026-09-21, six sessions behind one 25k-token system prefix shared one key
    keys = {session_key(chat_ctx(build, [SYSTEM, {"role": "user", "content": f"task {i}: fix the build"}]))
            for i in range(6)}
    assert len(keys) == 6 and all(kind == "hashed" for kind, _ in keys)


def test_a_session_keeps_its_key_as_the_conversation_grows(build):
    turn = [SYSTEM, {"role": "user", "content": "task"}]
    later = turn + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    assert session_key(chat_ctx(build, turn)) == session_key(chat_ctx(build, later))
    assert session_key(chat_ctx(build, turn)) != session_key(chat_ctx(build, turn, model="gemma3:1b"))
    assert session_key(chat_ctx(build, turn, model="m")) == session_key(chat_ctx(build, turn, model="m:latest"))


def test_the_head_is_every_leading_system_message_and_the_first_after_them():
    msgs = [{"role": "system", "content": "a"}, {"role": "developer", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    assert prompt_head("chat", {"messages": msgs}) == msgs[:3]
    assert prompt_head("chat", {"messages": msgs[:2]}) == msgs[:2]
    assert prompt_head("completion", {"prompt": "p", "system": "s"}) == {"system": "s", "prompt": "p"}
    assert prompt_head("completion", {"prompt": ""}) is None
    assert prompt_head("chat", {"messages": "nope"}) is None


def test_an_agent_dialects_head_is_its_system_and_first_turn_without_cache_marks():
    """Messages: system + first turn; Responses: instructions + leading system items + the
    first after them. Claude Code moves cache_control to the newest turn on every call: the
    head, and so the session's digest, must not move with it."""
    system = [{"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}]
    first = {"role": "user", "content": [{"type": "text", "text": "fix it", "cache_control": {"type": "ephemeral"}}]}
    turn1 = {"system": system, "messages": [first]}
    unmarked = {"role": "user", "content": [{"type": "text", "text": "fix it"}]}
    turn2 = {"system": system, "messages": [unmarked, {"role": "assistant", "content": "ok"},
                                            {"role": "user", "content": "more"}]}
    head = prompt_head("chat", turn1, "/v1/messages")
    assert head == prompt_head("chat", turn2, "/v1/messages")
    assert head == {"system": [{"type": "text", "text": "You are an agent."}], "first": [unmarked]}
    other = {"system": system, "messages": [{"role": "user", "content": "another task"}]}
    assert prompt_head("chat", other, "/v1/messages") != head
    items = [{"role": "developer", "content": "rules"}, {"role": "user", "content": "task"},
             {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]
    assert prompt_head("chat", {"instructions": "be brief", "input": items}, "/v1/responses") == \
        {"instructions": "be brief", "first": items[:2]}
    assert prompt_head("chat", {"input": "just text"}, "/v1/responses") == {"instructions": None, "first": "just text"}
    assert prompt_head("chat", {"messages": []}, "/v1/messages") is None


def test_completion_and_generate_digest_prompt_and_system_whole(build):
    def key(route, body):
        return session_key(build.context(route, {"model": "m", **body}, cfg=build.settings(limit=2)))

    assert key("/api/generate", {"prompt": "p" * 10_000 + "1"}) != key("/api/generate", {"prompt": "p" * 10_000 + "2"})
    assert key("/api/generate", {"prompt": "p", "system": "s1"}) != \
        key("/api/generate", {"prompt": "p", "system": "s2"})
    assert key("/v1/completions", {"prompt": "p"}) == key("/api/generate", {"prompt": "p"})


def test_the_header_names_the_session_with_the_model(build):
    a = session_key(chat_ctx(build, [{"role": "user", "content": "x"}], session="run-1"))
    b = session_key(chat_ctx(build, [{"role": "user", "content": "y"}], session="run-1"))
    c = session_key(chat_ctx(build, [{"role": "user", "content": "x"}], session="run-1", model="other"))
    assert a == b and a[0] == "header" and a != c and "run-1" not in a[1]


def test_the_key_never_appears_in_the_section(build):
    stage = stage_for(build)
    ctx = build.context(cfg=build.settings(limit=2), session="secret-session")
    _, section = stage.apply([build.local(), build.peer("b")], ctx)
    assert ctx.scratch["affinity_key"] not in str(section) and "secret-session" not in str(section)


# -- the table -----------------------------------------------------------------------

def test_ttl_comes_from_the_environment_with_a_one_second_floor(monkeypatch):
    assert ttl_ms_from({}) == 600_000
    assert ttl_ms_from({"HUB_POOL_PREFIX_AFFINITY_TTL_MS": "0"}) == 600_000
    assert ttl_ms_from({"HUB_POOL_PREFIX_AFFINITY_TTL_MS": "junk"}) == 600_000
    assert ttl_ms_from({"HUB_POOL_PREFIX_AFFINITY_TTL_MS": "200"}) == 1000
    assert ttl_ms_from({"HUB_POOL_PREFIX_AFFINITY_TTL_MS": "-5"}) == 1000
    assert ttl_ms_from({"HUB_POOL_PREFIX_AFFINITY_TTL_MS": "5000"}) == 5000
    monkeypatch.setenv("HUB_POOL_PREFIX_AFFINITY_TTL_MS", "2500")
    assert PrefixAffinityStage().table.ttl_s == 2.5  # read once, at construction


def test_entries_expire_after_their_last_placement():
    now = [0.0]
    table = AffinityTable(ttl_ms=10_000, clock=lambda: now[0])
    table.remember("k", "local", "ollama")
    now[0] = 9.9
    assert table.get("k") == ("local", "ollama")
    now[0] = 10.0
    assert table.get("k") is None and len(table) == 0


def test_at_most_a_thousand_keys_least_recently_placed_dropped_first():
    table = AffinityTable(ttl_ms=600_000)
    for i in range(MAX_KEYS):
        table.remember(f"k{i}", "local", "ollama")
    table.remember("k0", "b", "vllm")  # placed again: now the most recent
    table.get("k1")  # reading refreshes nothing
    table.remember("new", "local", "ollama")
    assert len(table) == MAX_KEYS
    assert table.get("k1") is None and table.get("k0") == ("b", "vllm") and table.get("new")


# -- properties -----------------------------------------------------------------------

candidate_specs = st.lists(st.tuples(st.sampled_from(["local", "a", "b", "c"]), st.sampled_from(["ollama", "vllm"]),
                                     st.integers(0, 25)), min_size=0, max_size=6)


def _ranking(build, specs):
    return [build.local(kind, in_flight=n) if name == "local" else build.peer(name, kind, in_flight=n)
            for name, kind, n in specs]


@settings(max_examples=150, deadline=None)
@given(specs=candidate_specs, margin=st.integers(0, 20), route=st.sampled_from(
    ["/api/chat", "/v1/chat/completions", "/api/generate", "/v1/completions", "/v1/embeddings"]))
def test_at_affinity_zero_nothing_is_hashed_remembered_or_moved(build, specs, margin, route):
    stage = PrefixAffinityStage(build.node())
    calls = []
    ranking = _ranking(build, specs)
    ctx = build.context(route, {"model": "m", "messages": [{"role": "user", "content": "x"}], "prompt": "x"},
                        cfg=build.settings(limit=0, margin=margin), session="s")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(affinity_module.hashlib, "sha256", lambda *a: calls.append(a) or hashlib.sha256(*a))
        assert not stage.enabled(ctx)
        out, sections = run_stages([stage], list(ranking), ctx, [])
        for cand in out:
            stage.placed(ctx, cand)
            stage.failed_over(ctx, cand)
        stage.exhausted(ctx)
    assert out == ranking and "affinity" not in sections
    assert calls == [] and len(stage.table) == 0 and ctx.scratch == {} and ctx.response_headers == {}


@settings(max_examples=200, deadline=None)
@given(specs=candidate_specs, remembered=st.sampled_from([("local", "ollama"), ("a", "vllm"), ("b", "ollama"),
                                                         ("z", "ollama")]),
       limit=st.integers(1, 20), margin=st.integers(0, 20), local_load=st.integers(0, 25))
def test_apply_never_adds_or_removes_a_candidate(build, specs, remembered, limit, margin, local_load):
    stage = PrefixAffinityStage(build.node(local_in_flight=local_load))
    stage.table.remember("k", *remembered)
    ranking = _ranking(build, specs)
    ctx = build.context(cfg=build.settings(limit=limit, margin=margin))
    ctx.scratch[affinity_module.SCRATCH_SESSION] = ("hashed", "k")
    out, section = stage.apply(list(ranking), ctx)
    assert sorted(map(id, out)) == sorted(map(id, ranking))
    if section is not None and section["qualified"]:  # the remembered one first, the rest in ranked order
        assert (out[0].node, out[0].backend) == remembered
        assert [id(c) for c in out[1:]] == [id(c) for c in ranking if c is not out[0]]
    else:
        assert [id(c) for c in out] == [id(c) for c in ranking]
    if ranking:
        assert section["outcome"] in {"hit", "miss", "skipped"}
        assert section["qualified"] == ("affinity_hold" in ctx.scratch)
