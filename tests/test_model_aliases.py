"""Issue 25 item 3: model aliases (poolModelAliases), through two paired nodes on loopback.

hub-a holds only gpt-oss:20b; hub-b holds qwen3:8b, the model hub-a's `auto` prefers. An app on hub-a asks
for names no node serves — Claude Code's background claude-haiku-…, Codex's default model —
and an alias resolves them; a name a node serves is never taken by a pattern. The headers, the
routing log, `hubpool log` and /v1/models show both names; `hubpool alias` edits them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import ExitStack
from fnmatch import fnmatchcase

import anthropic
import httpx
import pytest
from harness import RunningNode, fqdn, make_pool, pair, poll_until_offered
from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.placement.aliases import alias_target
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
HAIKU = "claude-haiku-4-5-20251001"


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("aliases")
    with ExitStack() as stack:
        a_sim = stack.enter_context(run_in_thread(SimConfig(flavor="llamacpp", models=[SimModel("gpt-oss:20b")])))
        b_sim = stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel("qwen3:8b")])))
        nodes = make_pool(root, ["hub-a", "hub-b"], per_node={"hub-a": {"LLAMACPP_URL": a_sim.url},
                                                               "hub-b": {"OLLAMA_URL": b_sim.url}})
        for n in nodes.values():
            stack.enter_context(n)
        pair(nodes["hub-a"], nodes["hub-b"])
        poll_until_offered(nodes["hub-a"], [nodes["hub-b"]], "qwen3:8b")
        _settings(nodes["hub-a"], inferenceModel="qwen3:8b")  # auto, wherever in the pool it is served
        yield nodes


def _row(node, rid):
    with node.client(headers=node.headers()) as c:
        log = c.get(P + "/routing-log/annotated?limit=100").json()["entries"]
    return next(e for e in log if e["id"] == rid)


def _settings(node, **changes):
    with node.client(headers=node.headers()) as c:
        r = c.patch(P + "/settings", json=changes)
    assert r.status_code == 200, r.text


def _cli(node, *args):
    env = {**os.environ, "HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
           "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True, env=env,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_claude_codes_background_model_resolves_by_the_default_alias(pool):
    a = pool["hub-a"]
    claude = anthropic.Anthropic(base_url=a.url, api_key="unused-inside", max_retries=0)
    raw = claude.messages.with_raw_response.create(model=HAIKU, max_tokens=4,
                                                   messages=[{"role": "user", "content": "title this"}])
    assert raw.headers["x-hub-pool-model"] == "qwen3:8b" and raw.headers["x-hub-pool-model-requested"] == HAIKU
    assert raw.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    assert raw.parse().content[0].text
    row = _row(a, raw.headers["x-hub-pool-request-id"])
    assert row["model"] == "qwen3:8b" and row["requestedModel"] == HAIKU
    assert any(HAIKU in note and "alias" in note for note in row["notes"]), row["notes"]
    # the served model's own requests carry no requested name
    plain = httpx.post(a.url + "/v1/chat/completions", json={"model": "qwen3:8b", "messages": [
        {"role": "user", "content": "hi"}]}, timeout=30)
    assert "x-hub-pool-model-requested" not in plain.headers
    assert _row(a, plain.headers["x-hub-pool-request-id"])["requestedModel"] is None


def test_an_alias_never_takes_a_model_a_node_serves_and_exact_names_come_first(pool):
    a = pool["hub-a"]
    _settings(a, poolModelAliases={"gpt-*": "auto", "gpt-5-codex": "gpt-oss:20b"})
    try:
        def ask(model):
            r = httpx.post(a.url + "/v1/responses", json={"model": model, "input": "hi"}, timeout=30)
            assert r.status_code == 200, r.text
            return r.headers["x-hub-pool-model"], r.headers.get("x-hub-pool-model-requested")

        assert ask("gpt-oss:20b") == ("gpt-oss:20b", None)  # served by hub-a: never aliased
        assert ask("gpt-5-codex") == ("gpt-oss:20b", "gpt-5-codex")  # the exact name before the pattern
        assert ask("GPT-4o") == ("qwen3:8b", "GPT-4o")  # names compare case-insensitively
        # an unknown name no alias matches is refused as before, in the dialect's shape
        r = httpx.post(a.url + "/v1/messages", json={"model": "nobody-has:1b", "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": "x"}]}, timeout=30)
        assert r.status_code == 404 and r.json()["type"] == "error"
    finally:
        _settings(a, poolModelAliases={"claude-*": "auto"})


def test_the_listing_names_the_aliases_and_the_settings_refuse_a_bad_one(pool, tmp_path):
    a = pool["hub-a"]
    listed = {m["id"]: m["owned_by"] for m in httpx.get(a.url + "/v1/models", timeout=30).json()["data"]}
    assert listed["claude-*"] == "hub-pool-alias" and listed["qwen3:8b"] == "hub-pool"
    with a.client(headers=a.headers()) as c:
        bad = c.patch(P + "/settings", json={"poolModelAliases": {"claude *": "auto"}})
        assert bad.status_code == 422 and "glob patterns" in bad.text
    # a node with nothing to serve still says so: an alias is not a model
    with RunningNode(tmp_path / "empty") as empty:
        r = httpx.get(empty.url + "/v1/models", timeout=30)
        assert r.status_code == 502, r.text


def test_hubpool_alias_adds_lists_and_removes_and_hubpool_log_shows_both_names(pool):
    a = pool["hub-a"]
    added = _cli(a, "alias", "add", "gpt-5*", "qwen3:8b")
    assert added.returncode == 0 and "gpt-5*" in added.stdout and "qwen3:8b" in added.stdout, added.stderr
    listed = _cli(a, "alias", "list")
    assert listed.returncode == 0 and "claude-*" in listed.stdout and "gpt-5*" in listed.stdout
    r = httpx.post(a.url + "/v1/responses", json={"model": "gpt-5.2-codex", "input": "hi"}, timeout=30)
    assert r.headers["x-hub-pool-model"] == "qwen3:8b"
    log = _cli(a, "log", "--limit", "5")
    assert log.returncode == 0 and "gpt-5.2-codex→qwen3:8b" in log.stdout, log.stdout
    assert "asked for gpt-5.2-codex, placed as qwen3:8b" in log.stdout
    missing = _cli(a, "alias", "remove", "nope-*")
    assert missing.returncode == 1 and "no alias named 'nope-*'" in missing.stderr and "Traceback" not in missing.stderr
    removed = _cli(a, "alias", "remove", "gpt-5*")
    assert removed.returncode == 0 and "gpt-5*" not in removed.stdout
    assert a.node.settings.current.poolModelAliases == {"claude-*": "auto"}


names = st.from_regex(r"[a-z][a-z0-9.:-]{0,20}", fullmatch=True)


@given(aliases=st.dictionaries(names | names.map(lambda n: n[:3] + "*"), names | st.just("auto"), max_size=6),
       model=names, served=st.booleans())
def test_an_alias_applies_only_to_an_unserved_name_and_exact_names_win(aliases, model, served):
    found = alias_target(aliases, model, lambda m: served)
    if served:
        assert found is None  # a name a node lists is placed as itself, whatever the aliases say
        return
    exact = [k for k in aliases if "*" not in k and k.lower() == model.lower()]
    patterns = [k for k in aliases if "*" in k and fnmatchcase(model.lower(), k.lower())]
    if exact:
        assert found == (aliases[exact[0]], exact[0])
    elif patterns:
        assert found == (aliases[patterns[0]], patterns[0])  # the first pattern written
    else:
        assert found is None
