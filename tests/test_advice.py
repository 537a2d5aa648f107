"""Preferences, the client handout and doctor, through running nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from harness import RunningNode, make_pool, pair

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"


def cli(node, *args):
    env = {**os.environ, "HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
           "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def node(tmp_path):
    cfg = SimConfig(flavor="vllm", models=[SimModel("qwen3:8b", window=32768), SimModel("tiny:1b", window=4096)])
    with run_in_thread(cfg) as sim, RunningNode(tmp_path / "n", {"VLLM_URL": sim.url}) as n:
        yield n


def test_preferences_round_trip_and_are_advertised(node):
    with node.client(headers=node.headers()) as c:
        assert c.get("/api/inference/preferences").json() == {"maxNumCtx": None, "ollamaSlots": None}
        assert c.patch("/api/inference/preferences", json={"maxNumCtx": 16384, "ollamaSlots": 4}).status_code == 200
        bad = c.patch("/api/inference/preferences", json={"maxNumCtx": 10, "ollamaSlots": 2})
        assert bad.status_code == 422 and "maxNumCtx" in bad.json()["error"]
        assert c.get("/api/inference/preferences").json() == {"maxNumCtx": 16384, "ollamaSlots": 4}
        assert c.patch(P + "/settings", json={"maxNumCtx": 1}).status_code == 422  # not a pool setting
        local = c.get(P + "/status").json()["localNode"]
    assert local["maxNumCtx"] == 16384 and local["ollamaSlots"] == 4
    assert cli(node, "context-cap", "clear").returncode == 0
    assert cli(node, "slots", "2").stdout.strip() == "Slots: 2"


def test_the_ceiling_env_override_wins_and_is_reported(tmp_path):
    with RunningNode(tmp_path / "n", {"HUB_POOL_MAX_PROMPT_TOKENS": "20000"}) as n, n.client(headers=n.headers()) as c:
        c.patch(P + "/settings", json={"poolMaxPromptTokens": 16000})
        local = c.get(P + "/status").json()["localNode"]
        assert (local["maxPromptTokens"], local["maxPromptTokensSetBy"]) == (20000, "env")
    with RunningNode(tmp_path / "m", {"HUB_POOL_MAX_PROMPT_TOKENS": "12.5k"}) as n, n.client(headers=n.headers()) as c:
        c.patch(P + "/settings", json={"poolMaxPromptTokens": 16000})
        local = c.get(P + "/status").json()["localNode"]
        assert (local["maxPromptTokens"], local["maxPromptTokensSetBy"]) == (16000, "setting")  # ignored, not guessed


def test_the_handout_names_urls_model_and_window(node):
    r = httpx.get(node.url + P + "/handout")
    assert r.status_code == 200
    h = r.json()
    assert h["openaiBaseUrl"] == node.url + "/v1" and h["nativeBaseUrl"] == node.url
    assert h["model"] == "qwen3:8b" and h["numCtx"] == 32768 and h["servedBy"] == ["local"]
    assert h["env"]["CI_LLM_NUM_CTX"] == "32768" and h["env"]["OLLAMA_HOST"] == node.url
    # what an agent needs: Claude Code's and Codex's base URLs, and the model
    assert h["anthropicBaseUrl"] == h["env"]["ANTHROPIC_BASE_URL"] == node.url
    assert h["env"]["ANTHROPIC_MODEL"] == "qwen3:8b" and h["env"]["OPENAI_BASE_URL"] == node.url + "/v1"
    with node.client(headers=node.headers()) as c:
        c.patch("/api/inference/preferences", json={"maxNumCtx": 16384})
    assert httpx.get(node.url + P + "/handout").json()["numCtx"] == 16384  # capped
    floor = httpx.get(node.url + P + "/handout?minContext=20000").json()  # the window fits, the cap does not
    assert floor["model"] == "qwen3:8b" and any("below this client's floor" in w for w in floor["warnings"])
    none = httpx.get(node.url + P + "/handout?minContext=64000").json()  # no model's window fits
    assert none["model"] is None and none["warnings"]
    out = cli(node, "handout", "--env")
    assert out.returncode == 0 and "CI_LLM_MODEL=qwen3:8b" in out.stdout
    assert f"ANTHROPIC_BASE_URL={node.url}" in out.stdout and "ANTHROPIC_MODEL=qwen3:8b" in out.stdout
    printed = cli(node, "handout")
    assert printed.returncode == 0 and f"Anthropic URL    {node.url}" in printed.stdout
    assert httpx.get(node.url + P + "/handout", headers={"cf-ray": "x"}).status_code == 401


def test_with_route_apps_always_off_and_no_peer_the_handout_names_the_engine(node):
    """Issue 16.11: poolRouteAppsAlways off, with no connected peer, hands out the local engine's
    own URL and says so; on (the default) the pool's. Rows carry localLoadRefused (null here)."""
    engine = node.environ["VLLM_URL"]
    with node.client(headers=node.headers()) as c:
        assert c.patch(P + "/settings", json={"poolRouteAppsAlways": False}).status_code == 200
    h = httpx.get(node.url + P + "/handout").json()
    assert h["model"] == "qwen3:8b" and h["openaiBaseUrl"] == engine + "/v1"
    assert h["nativeBaseUrl"] is None and h["routedThroughPool"] is False  # vLLM speaks no native dialect
    assert h["env"]["CI_LLM_BASE_URL"] == engine + "/v1" and "OLLAMA_HOST" not in h["env"]
    assert any("poolRouteAppsAlways" in w and engine in w for w in h["warnings"])
    out = cli(node, "handout")
    assert out.returncode == 0 and engine + "/v1" in out.stdout and "poolRouteAppsAlways" in out.stdout
    with node.client(headers=node.headers()) as c:
        c.patch(P + "/settings", json={"poolRouteAppsAlways": True})
    h = httpx.get(node.url + P + "/handout").json()
    assert h["openaiBaseUrl"] == node.url + "/v1" and h["routedThroughPool"] is True
    r = httpx.post(node.url + "/v1/chat/completions", json={"model": "qwen3:8b",
                                                            "messages": [{"role": "user", "content": "x"}]})
    with node.client(headers=node.headers()) as c:
        row = next(e for e in c.get(P + "/routing-log").json()["entries"] if e["id"] == r.headers["x-hub-pool-request-id"])
    assert "localLoadRefused" in row and row["localLoadRefused"] is None  # hubpool refuses no load


def test_the_handout_caps_at_the_largest_cap_among_serving_nodes(tmp_path):
    with run_in_thread(SimConfig(flavor="vllm", models=[SimModel("big:30b", window=65536)])) as sim_b, \
            run_in_thread(SimConfig(flavor="vllm", models=[SimModel("big:30b", window=65536)])) as sim_c:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b", "hub-c"],
                          per_node={"hub-b": {"VLLM_URL": sim_b.url}, "hub-c": {"VLLM_URL": sim_c.url}})
        for n in nodes.values():
            n.start()
        a = nodes["hub-a"]
        try:
            for name, cap in (("hub-b", 16384), ("hub-c", 65536)):
                other = nodes[name]
                with other.client(headers=other.headers()) as c:
                    c.patch("/api/inference/preferences", json={"maxNumCtx": cap})
                pair(a, other)
            a.run(a.node.health.poll_once())
            h = httpx.get(a.url + P + "/handout").json()
            assert h["model"] == "big:30b" and h["numCtx"] == 65536  # the largest, not the smallest
            with nodes["hub-c"].client(headers=nodes["hub-c"].headers()) as c:
                c.patch("/api/inference/preferences", json={"maxNumCtx": None})
            a.run(a.node.health.poll_once())
            assert httpx.get(a.url + P + "/handout").json()["numCtx"] is None  # one uncapped node: no cap
        finally:
            for n in nodes.values():
                n.stop()


def test_doctor_names_an_unreachable_engine_and_exits_1(tmp_path):
    with RunningNode(tmp_path / "n", {"OLLAMA_URL": "http://127.0.0.1:9"}) as n:
        r = cli(n, "doctor")
        assert r.returncode == 1
        assert "ollama" in r.stdout and "http://127.0.0.1:9" in r.stdout and "OLLAMA_URL" in r.stdout
        data = json.loads(cli(n, "doctor", "--json").stdout)
        assert data["ok"] is False
        c1 = next(c for c in data["checks"] if c["id"] == "C1")
        assert c1["verdict"] == "needs action"  # this test node is on no tailnet


def test_doctor_is_ready_on_a_healthy_tailnet_node(tmp_path):
    with run_in_thread(SimConfig(flavor="ollama", models=[SimModel("m:1b")])) as sim:
        # only Ollama is configured; the other engines are left at their defaults (not installed here)
        defaults = {v: "" for v in ("VLLM_URL", "LLAMACPP_URL", "LEMONADE_URL", "OMLX_URL")}
        nodes = make_pool(tmp_path, ["hub-a"], per_node={"hub-a": {"OLLAMA_URL": sim.url, **defaults}})
        with nodes["hub-a"] as n:
            data = json.loads(cli(n, "doctor", "--json").stdout)
            verdicts = {c["id"]: c["verdict"] for c in data["checks"]}
            assert verdicts["C1"] == "ready" and verdicts["E1"] == "ready" and verdicts["F1"] == "ready"
            assert data["ok"] is True and cli(n, "doctor").returncode == 0


def test_the_agent_handouts_configure_claude_code_codex_and_opencode(node):
    """`hubpool handout --agent`: each agent's environment and config file, pointed at this node
    (never an engine), asked with tools and a 32k floor (qwen3:8b's 32768 window fits it)."""
    import tomllib

    claude = cli(node, "handout", "--agent", "claude-code", "--json")
    assert claude.returncode == 0, claude.stderr
    setup = json.loads(claude.stdout)
    env = setup["env"]
    assert env["ANTHROPIC_BASE_URL"] == node.url and env["ANTHROPIC_MODEL"] == "qwen3:8b"
    assert env["ANTHROPIC_AUTH_TOKEN"] and env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"  # a quarter of the window, not Claude Code's 32000
    # the default alias claude-* -> auto resolves Claude Code's background model: no variable for it
    assert "ANTHROPIC_DEFAULT_HAIKU_MODEL" not in env and any("'claude-*'" in n for n in setup["notes"])
    with node.client(headers=node.headers()) as c:
        assert c.patch(P + "/settings", json={"poolModelAliases": {}}).status_code == 200
    bare = cli(node, "handout", "--agent", "claude-code", "--env")
    env = dict(line.split("=", 1) for line in bare.stdout.splitlines())
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == env["ANTHROPIC_DEFAULT_SONNET_MODEL"] == "qwen3:8b"
    assert env["CLAUDE_CODE_SUBAGENT_MODEL"] == "qwen3:8b"

    codex = json.loads(cli(node, "handout", "--agent", "codex", "--json").stdout)
    (config,) = codex["files"]
    assert config["path"] == "~/.codex/config.toml"
    toml = tomllib.loads(config["content"])
    assert toml["model"] == "qwen3:8b" and toml["model_provider"] == "hubpool" and toml["model_context_window"] == 32768
    provider = toml["model_providers"]["hubpool"]
    assert provider["base_url"] == node.url + "/v1" and provider["wire_api"] == "responses"
    assert codex["env"] == {provider["env_key"]: "hubpool"} and toml["analytics"]["enabled"] is False

    opencode = json.loads(cli(node, "handout", "--agent", "opencode", "--json").stdout)
    config = json.loads(opencode["files"][0]["content"])
    assert opencode["files"][0]["path"] == "~/.config/opencode/opencode.json"
    assert config["model"] == config["small_model"] == "hubpool/qwen3:8b"
    hub = config["provider"]["hubpool"]
    assert hub["npm"] == "@ai-sdk/openai-compatible" and hub["options"]["baseURL"] == node.url + "/v1"
    assert hub["models"]["qwen3:8b"]["limit"] == {"context": 32768, "output": 8192}

    printed = cli(node, "handout", "--agent", "codex")
    assert printed.returncode == 0 and "# ~/.codex/config.toml" in printed.stdout
    assert f'base_url = "{node.url}/v1"' in printed.stdout and printed.stdout.rstrip().count("codex") >= 2
    # a floor the pool cannot meet: no model, and the warning says what to do
    small = json.loads(cli(node, "handout", "--agent", "claude-code", "--min-context", "64000", "--json").stdout)
    assert small["model"] == "auto" and any("no chat model" in w for w in small["warnings"])
    wrong = cli(node, "handout", "--agent", "cursor")
    assert wrong.returncode == 1 and "claude-code, codex, opencode" in wrong.stdout + wrong.stderr
    # even when apps go to the engine directly, an agent goes through the node (it translates)
    with node.client(headers=node.headers()) as c:
        c.patch(P + "/settings", json={"poolRouteAppsAlways": False})
    direct = json.loads(cli(node, "handout", "--agent", "claude-code", "--json").stdout)
    assert direct["env"]["ANTHROPIC_BASE_URL"] == node.url and direct["baseUrl"] == node.url
