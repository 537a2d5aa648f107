"""Issue 25 item 2: sessions from every agent's own id, in every spelling it uses.

The parser's properties (hypothesis), then one node on loopback that each agent's real
headers and body fields reach: Claude Code's X-Claude-Code-Session-Id and metadata.user_id
(JSON, and the legacy string), Codex's session-id header and prompt_cache_key, OpenCode's
x-session-id / x-session-affinity. The routing log's affinity.keySource names the source
used, and no id is ever in the log.
"""

from __future__ import annotations

import json
from contextlib import ExitStack

import httpx
import pytest
from harness import RunningNode
from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.config import DEFAULT_SESSION_SOURCES, LEGACY_DEFAULT_SESSION_SOURCES, SettingsStore
from hubpool_core.placement.sessions import session_of, session_part
from hubpool_sim import SimConfig, SimModel, run_in_thread

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9-]{7,40}", fullmatch=True)
MODEL = "native:8b"


def _spellings(name: str) -> st.SearchStrategy[str]:
    """Every way a client may spell a header name: any case, - and _ swapped."""
    return st.lists(st.booleans(), min_size=len(name), max_size=len(name)).flatmap(
        lambda upper: st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
            lambda swap: "".join(("_" if c == "-" else "-") if c in "-_" and s else (c.upper() if u else c.lower())
                                 for c, u, s in zip(name, upper, swap, strict=True))))


@given(name=st.sampled_from([s.partition(":")[2] for s in DEFAULT_SESSION_SOURCES if s.startswith("header:")
                             and s != "header:X-Hub-Pool-Session"]).flatmap(
    lambda n: st.tuples(st.just(n), _spellings(n))), value=ids)
def test_a_header_source_matches_any_case_and_either_separator(name, value):
    canonical, spelled = name
    found = session_of(DEFAULT_SESSION_SOURCES, {spelled: value}, {})
    assert found is not None and found[1] == canonical
    assert found[0] != value and len(found[0]) == 64  # hashed before anything keeps it
    assert found == session_of(DEFAULT_SESSION_SOURCES, {canonical.lower(): value}, {})


@given(session=ids, device=ids, other_device=ids, account=ids)
def test_claude_codes_user_id_is_keyed_on_its_session_alone(session, device, other_device, account):
    """metadata.user_id is a JSON string in current Claude Code and user_…_account_…_session_…
    in older builds; either way two requests of one session are one key, whatever else the
    value carries, and two sessions are two."""
    def key(user_id: str) -> str | None:
        found = session_of(DEFAULT_SESSION_SOURCES, {}, {"metadata": {"user_id": user_id}})
        assert found is not None and found[1] == "metadata.user_id"
        return found[0]

    as_json = key(json.dumps({"device_id": device, "account_uuid": account, "session_id": session}))
    assert as_json == key(json.dumps({"device_id": other_device, "account_uuid": "", "session_id": session}))
    assert as_json == key(f"user_{device}_account_{account}_session_{session}")
    assert as_json != key(json.dumps({"device_id": device, "account_uuid": account, "session_id": session + "x"}))
    assert session_part("plain-id") == "plain-id"
    assert session_part("{not json") == "{not json"


def test_the_first_source_a_request_carries_wins():
    headers = {"x-session-id": "opencode-1", "session-id": "codex-1", "x-claude-code-session-id": "claude-1"}
    assert session_of(DEFAULT_SESSION_SOURCES, headers, {})[1] == "X-Claude-Code-Session-Id"
    assert session_of(DEFAULT_SESSION_SOURCES, {"x-session-id": "o"}, {"prompt_cache_key": "c"})[1] == \
        "prompt_cache_key"
    assert session_of(DEFAULT_SESSION_SOURCES, {"x-session-affinity": "o"}, {})[1] == "x-session-affinity"
    assert session_of(DEFAULT_SESSION_SOURCES, {}, {"prompt_cache_key": 7}) is None  # not a string: no key


def test_a_settings_file_with_the_old_default_takes_the_new_one(tmp_path):
    """Settings are written whole, so every node that ever saved a setting holds the old default
    list; it was never the operator's choice, and now misses two of the three agents."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"poolSessionSources": LEGACY_DEFAULT_SESSION_SOURCES, "poolLocalAffinity": 2}))
    store = SettingsStore(path)
    assert store.current.poolSessionSources == list(DEFAULT_SESSION_SOURCES)
    assert store.current.poolLocalAffinity == 2
    path.write_text(json.dumps({"poolSessionSources": ["header:x-my-run"]}))
    assert SettingsStore(path).current.poolSessionSources == ["header:x-my-run"]  # an operator's list stays


CLAUDE_USER_ID = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": "5f1b5f08-claude"})
#: (what each agent sends, the keySource its turns are keyed on)
AGENTS = [
    ("/v1/messages", {"x-claude-code-session-id": "5f1b5f08-claude"},
     {"max_tokens": 4, "metadata": {"user_id": CLAUDE_USER_ID}, "messages": [{"role": "user", "content": "hi"}]},
     "X-Claude-Code-Session-Id"),
    ("/v1/messages", {}, {"max_tokens": 4, "metadata": {"user_id": "user_ab_account_cd_session_ef01"},
                          "messages": [{"role": "user", "content": "hi"}]}, "metadata.user_id"),
    ("/v1/responses", {"session-id": "01a24948-codex", "thread-id": "01a24948-codex"},
     {"input": "hi", "prompt_cache_key": "01a24948-codex", "store": False}, "session-id"),
    ("/v1/responses", {}, {"input": "hi", "prompt_cache_key": "01a24948-codex-2"}, "prompt_cache_key"),
    ("/v1/chat/completions", {"x-session-id": "ses_opencode", "x-session-affinity": "ses_opencode"},
     {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}, "x-session-id"),
]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with ExitStack() as stack:
        sim = stack.enter_context(run_in_thread(SimConfig(flavor="llamacpp", models=[SimModel(MODEL)])))
        n = stack.enter_context(RunningNode(tmp_path_factory.mktemp("sessions") / "n", {"LLAMACPP_URL": sim.url}))
        with n.client(headers=n.headers()) as c:
            assert c.patch("/api/inference/pool/settings", json={"poolPrefixAffinityMaxInFlight": 4}).status_code == 200
        yield n


@pytest.mark.parametrize("route,headers,body,source", AGENTS)
def test_each_agents_own_id_keys_its_turns_and_the_log_names_it(node, route, headers, body, source):
    rows = []
    for _ in range(2):
        r = httpx.post(node.url + route, json={"model": MODEL, **body}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        with node.client(headers=node.headers()) as c:
            log = c.get("/api/inference/pool/routing-log?limit=50").json()
        rows.append(next(e for e in log["entries"] if e["id"] == r.headers["x-hub-pool-request-id"]))
        assert r.headers.get("x-hub-pool-affinity") in ("hit", "miss")
    sections = [row["affinity"] for row in rows]
    assert [s["key"] for s in sections] == ["header", "header"] and [s["keySource"] for s in sections] == [source] * 2
    assert [s["outcome"] for s in sections] == ["miss", "hit"]
    text = json.dumps(log)
    for value in [*headers.values(), "5f1b5f08-claude", "01a24948-codex", "ses_opencode"]:
        assert value not in text  # hashed, never logged
