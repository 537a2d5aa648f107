"""`hubpool bench pool`: its traces, statistics and dispatchers, so its figures can be trusted.

The end-to-end test replays a small trace through every dispatcher on a two-node pool of
simulated engines (real processes: hubpool nodes paired as operators pair them, nginx when
installed, the oracle) and checks that every request is accounted for, once, on the engine
that says it served it."""

from __future__ import annotations

import json

import pytest

from hubpool_core.bench import pool_traces as traces
from hubpool_core.bench.pool import (
    ALL_DISPATCHERS,
    NGINX_POLICIES,
    RunResult,
    bootstrap,
    nginx_conf,
    percentile,
    run_bench,
    summarise,
)
from hubpool_core.bench.pool_traces import NodeSpec, TraceRequest, messages_for
from hubpool_core.bench.procs import nginx_path

TWO = (NodeSpec("fast", 2, 4000, 50, load_ms=4000), NodeSpec("slow", 1, 400, 10, load_ms=4000))


def rendered(messages):  # what the simulator (and a real engine's prompt cache) sees
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages)


def test_a_trace_file_round_trips_and_bad_lines_are_named():
    trace = traces.agents(3, traces.UNEQUAL, sessions=2, turns=3)
    again = traces.parse(trace.dumps())
    assert again.name == "agents" and again.slo_ms == trace.slo_ms
    assert [r.to_json() for r in again.requests] == [r.to_json() for r in trace.requests]
    with pytest.raises(traces.TraceError, match="line 2: promptTokens"):
        traces.parse('{"format": "hubpool-trace/1"}\n{"at": 0, "outputTokens": 5}\n')
    with pytest.raises(traces.TraceError, match="header"):
        traces.parse('{"at": 0, "promptTokens": 5, "outputTokens": 5}\n')
    with pytest.raises(traces.TraceError, match="model"):
        traces.parse('{"format": "hubpool-trace/1"}\n{"promptTokens": 5, "outputTokens": 5, "model": "x"}\n')


def test_built_in_traces_are_seeded_and_shaped():
    for name in traces.BUILT_IN:
        assert traces.built_in(name, 5, traces.UNEQUAL).dumps() == traces.built_in(name, 5, traces.UNEQUAL).dumps()
        assert traces.built_in(name, 5, traces.UNEQUAL).dumps() != traces.built_in(name, 6, traces.UNEQUAL).dumps()
    chat = traces.built_in("chat", 1, traces.UNEQUAL)
    assert all(100 <= r.prompt_tokens <= 16_000 and r.session is None for r in chat.requests)
    expected = 0.57 * traces.pool_capacity(traces.UNEQUAL) * 240
    assert 0.7 * expected <= len(chat.requests) <= 1.3 * expected  # Poisson at 57 % of capacity
    agents = traces.built_in("agents", 1, traces.UNEQUAL)
    sessions = {r.session for r in agents.requests}
    assert len(sessions) == 6 and len(agents.requests) == 72
    assert traces.built_in("fleet", 1, traces.EQUAL).span_s <= 31
    burst = traces.built_in("burst", 1, traces.UNEQUAL)
    assert burst.span_s <= 30 and len(burst.requests) >= 0.7 * 3 * traces.pool_capacity(traces.UNEQUAL) * 30
    cold = traces.built_in("cold", 1, traces.UNEQUAL)
    assert all(r.model == "cold" for r in cold.requests) and cold.extra["warmNode"] == 1


def _session_prompts(turns: list[TraceRequest]) -> list[str]:
    """Each turn of one session rendered as the replayer sends it, each checked to open with the
    system message and to be as long as its trace says (four characters a token)."""
    sizes: list[int] = []
    prompts = []
    for i, turn in enumerate(turns):
        messages = messages_for(turn, i, list(sizes))
        prompts.append(rendered(messages))
        sizes.append(turn.prompt_tokens)
        assert messages[0]["role"] == "system"
        assert len("".join(m["content"] for m in messages)) == turn.prompt_tokens * 4
    return prompts


def test_a_session_turn_extends_the_one_before_and_sessions_differ():
    turns = [TraceRequest(0, 6000, 10, session="s"), TraceRequest(0, 6500, 10, session="s"),
             TraceRequest(0, 7400, 10, session="s")]
    prompts = _session_prompts(turns)
    assert prompts[2].startswith(prompts[1][:-1]) and prompts[1].startswith(prompts[0][:-1])
    other = rendered(messages_for(TraceRequest(0, 6000, 10, session="t"), 0, []))
    assert other[:200] != prompts[0][:200]
    unique = [rendered(messages_for(TraceRequest(0, 500, 10), i, [])) for i in range(2)]
    assert unique[0] != unique[1]


def test_statistics():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 95) == 95 and percentile(values, 99) == 99
    assert percentile([], 95) is None
    low, high = bootstrap(values, 95)
    assert low <= 95 <= high
    run = RunResult("chat", "x", 0, [
        {"status": 200, "ttftMs": 100.0, "e2eMs": 300.0, "sentAtS": 0.0, "sim": "fast"},
        {"status": 200, "ttftMs": 9000.0, "e2eMs": 9500.0, "sentAtS": 1.0, "sim": "slow"},
        {"status": 502, "ttftMs": None, "e2eMs": None, "sentAtS": 2.0, "error": "boom"},
    ], 10.0, 50, 200, {})
    s = summarise([run], slo_ms=5000)
    assert (s["requests"], s["served"], s["failed"], s["withinSlo"]) == (3, 2, 1, 1)
    assert s["goodputPerS"] == 0.1 and s["cacheShare"] == 0.25 and s["servedBy"] == {"fast": 1, "slow": 1}
    assert s["firstServedBy"] == [["fast", "slow", None]]


def test_nginx_weights_only_the_weighted_policy(tmp_path):
    servers = [("127.0.0.1:1", 4), ("127.0.0.1:2", 1)]
    conf = nginx_conf(tmp_path, {p: {"chat": ("9000", servers)} for p in NGINX_POLICIES})
    weighted = conf[conf.index("upstream nginx_weighted_chat"):]
    assert "server 127.0.0.1:1 weight=4;" in weighted and "least_conn;" in weighted
    rr = conf[conf.index("upstream nginx_rr_chat"):conf.index("upstream nginx_least_conn_chat")]
    assert "weight" not in rr and "least_conn" not in rr


def test_a_small_trace_through_every_dispatcher_on_two_nodes(tmp_path):
    report = run_bench(traces=("chat", "cold"), dispatchers=ALL_DISPATCHERS, rounds=1, scale=0.05, size=0.08,
                       seed=3, overhead_n=3, warmup=False, nodes=TWO, workdir=tmp_path)
    expected = {"chat": len(traces.built_in("chat", 3, TWO, 0.08).requests),
                "cold": len(traces.built_in("cold", 3, TWO, 0.08).requests)}
    ran = {r.dispatcher for r in report.runs}
    must = {"hubpool-default", "hubpool-documented", "hubpool-spec", "hubpool-base", "hubpool-queue", "oracle"}
    if nginx_path():
        must |= set(NGINX_POLICIES)
    assert must <= ran
    for name in set(ALL_DISPATCHERS) - ran:
        assert name in report.notes  # skipped, and the report says why
    for run in report.runs:
        assert len(run.requests) == expected[run.trace], (run.dispatcher, run.trace)
        assert sorted(r["i"] for r in run.requests) == list(range(expected[run.trace]))
        served = [r for r in run.requests if r["status"] == 200]
        assert len(served) == len(run.requests), (run.dispatcher, [r["error"] for r in run.requests])
        assert all(r["sim"] in ("fast", "slow") and r["ttftMs"] > 0 and r["e2eMs"] >= r["ttftMs"] for r in served)
        assert sum(run.sim_load.values()) == len(run.requests)
        assert run.prompt_tokens >= sum(r["promptTokens"] for r in run.requests)
    for trace, by in report.summary.items():
        for name, s in by.items():
            assert s["served"] + s["failed"] == s["requests"] == expected[trace]
            assert sum(s["servedBy"].values()) == s["served"]
    # the oracle never sends a cold request to a node that must load the model first when the
    # warm one is free: its first request goes to the warm node
    assert report.summary["cold"]["oracle"]["firstServedBy"][0][0] == "slow"
    assert report.overhead is not None and report.overhead["requests"] > 0
    assert json.loads(json.dumps(report.to_json()))["goals"]


def test_the_fleet_trace_shares_one_head_across_sessions_and_each_session_extends_itself():
    fleet = traces.built_in("fleet", 2, traces.EQUAL)
    sessions: dict[str, list[TraceRequest]] = {}
    for r in fleet.requests:
        sessions.setdefault(r.session, []).append(r)
    assert len(sessions) == 12 and all(len(turns) == 6 for turns in sessions.values())
    assert {r.prefix for r in fleet.requests} == {"fleet-agent-2"} and fleet.slo_ms == 10_000
    heads, firsts = set(), []
    for turns in sessions.values():
        prompts = _session_prompts(turns)
        assert all(b.startswith(a[:-1]) for a, b in zip(prompts, prompts[1:], strict=False))
        firsts.append(prompts[0])
        heads.add(rendered(messages_for(turns[0], 0, [])[:2]))
    shared = 16_000 * 4
    assert len({p[:shared] for p in firsts}) == 1  # every session starts with the agent's 16k tokens
    assert len({p[:shared + 400] for p in firsts}) == len(firsts)  # and then its own task
    assert len(heads) == len(firsts)  # so each session's prompt head (system + first turn) is its own
    again = traces.parse(fleet.dumps())
    assert [r.to_json() for r in again.requests] == [r.to_json() for r in fleet.requests]
    with pytest.raises(traces.TraceError, match="prefixTokens"):
        traces.parse('{"format": "hubpool-trace/1"}\n'
                     '{"promptTokens": 5, "outputTokens": 5, "session": "s", "prefix": "p", "prefixTokens": 9}\n')


def test_the_routers_are_dispatchers_when_installed_and_say_how_to_install_when_not(tmp_path):
    """SGLang's and vLLM's routers (optional: `uv sync --group routers`) in front of the same
    simulated engines; where a wheel is missing the report says how to install it. Bounded:
    one tiny trace, one round."""
    from hubpool_core.bench.pool_routers import INSTALL, SGLANG_CACHE_AWARE, routers

    known = routers()
    assert set(SGLANG_CACHE_AWARE) <= set(known) and len(known) == 4
    names = tuple(known)
    report = run_bench(traces=("agents",), dispatchers=(*names, "oracle"), rounds=1, scale=0.05, size=0.1,
                       seed=4, overhead_n=0, warmup=False, nodes=TWO, workdir=tmp_path)
    expected = len(traces.built_in("agents", 4, TWO, 0.1).requests)
    for name in names:
        if known[name]["missing"]:
            assert INSTALL in report.notes[name] and name not in report.summary.get("agents", {})
            continue
        s = report.summary["agents"][name]
        assert s["requests"] == s["served"] == expected, (name, s["errors"])
        assert sum(s["servedBy"].values()) == expected and set(s["servedBy"]) <= {"fast", "slow"}
    assert report.summary["agents"]["oracle"]["served"] == expected


def test_a_sessions_turns_are_listed_in_order_so_the_first_is_sent_first():
    """The agents trace once sorted its sessions' later turns (planned at 0.0) before their first
    turn, and the replay sent each session's first turn last."""
    for name in ("agents", "fleet"):
        trace = traces.built_in(name, 1, traces.UNEQUAL)
        sessions: dict[str, list[TraceRequest]] = {}
        for r in trace.requests:
            sessions.setdefault(r.session, []).append(r)
        for turns in sessions.values():
            assert turns[0].gap is None and all(t.gap is not None for t in turns[1:])
            assert [t.prompt_tokens for t in turns] == sorted(t.prompt_tokens for t in turns)
