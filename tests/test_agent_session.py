"""A coding agent's session through a three-node pool: every turn of one session lands on
the node that holds its prefix, while other sessions spread (spec: Prefix affinity; the
session named by Anthropic's metadata.user_id, as Claude Code sends it).

hub-a is the entry and holds no engine; hub-b and hub-c hold the model. Three sessions run
at once, ten turns each, shaped as Claude Code sends them: a long system prompt in blocks
with cache_control, a tool list, metadata.user_id, streamed, and cache_control moved to the
newest turn every time.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack

import anthropic
from harness import affinity_pool, fqdn

from hubpool_sim import SimConfig, SimModel, run_in_thread

MODEL = "qwen3-coder:30b"
SYSTEM = [
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
    {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks. "
                             * 200, "cache_control": {"type": "ephemeral"}},
]
TOOLS = [{"name": name, "description": f"The {name} tool.",
          "input_schema": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}}
         for name in ("Bash", "Read", "Edit", "Grep", "Glob", "Write", "TodoWrite")]
TURNS = 10


def _user_id() -> str:
    return f"user_{uuid.uuid4().hex * 2}_account__session_{uuid.uuid4()}"


def _with_cache_mark_on_last(messages):
    out = []
    for i, m in enumerate(messages):
        blocks = [dict(b) for b in m["content"]] if isinstance(m["content"], list) else \
            [{"type": "text", "text": m["content"]}]
        for b in blocks:
            b.pop("cache_control", None)
        if i == len(messages) - 1:
            blocks[-1]["cache_control"] = {"type": "ephemeral"}
        out.append({"role": m["role"], "content": blocks})
    return out


def _session(client, task: str, served: list[str], rids: list[str], errors: list[BaseException]) -> None:
    user_id = _user_id()
    messages = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>context</system-reminder>"},
                                              {"type": "text", "text": task}]}]
    try:
        for _turn in range(TURNS):
            with client.messages.stream(model=MODEL, max_tokens=32, system=SYSTEM, tools=TOOLS,
                                        metadata={"user_id": user_id},
                                        messages=_with_cache_mark_on_last(messages)) as stream:
                served.append(stream.response.headers["x-hub-pool-served-by"])
                rids.append(stream.response.headers["x-hub-pool-request-id"])
                final = stream.get_final_message()
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
            uses = [b for b in final.content if b.type == "tool_use"]
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": u.id, "content": "ok"} for u in uses] or "go on"})
    except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
        errors.append(exc)


def test_ten_turns_of_each_agent_session_stay_on_one_node_while_sessions_spread(tmp_path):
    with ExitStack() as stack:
        # slow enough that a session's turn is still in flight when the next session starts
        sims = {name: stack.enter_context(run_in_thread(SimConfig(
            flavor="llamacpp", models=[SimModel(MODEL, window=65536)], decode_ms_per_token=15)))
            for name in ("hub-b", "hub-c")}
        entry = affinity_pool(stack, tmp_path, {name: sim.url for name, sim in sims.items()}, MODEL)["hub-a"]

        client = anthropic.Anthropic(base_url=entry.url, api_key="unused-inside", max_retries=0)
        served: list[list[str]] = [[] for _ in range(3)]
        rids: list[list[str]] = [[] for _ in range(3)]
        errors: list[BaseException] = []
        threads = []
        for i, task in enumerate(("fix the failing test in parser.py", "add a --verbose flag",
                                  "explain the build script")):
            t = threading.Thread(target=_session, args=(client, task, served[i], rids[i], errors))
            t.start()
            threads.append(t)
            time.sleep(0.15)  # the next session starts while this one's first turn is in flight
        for t in threads:
            t.join(120)
        assert not errors, errors

        assert all(len(s) == TURNS for s in served), served
        homes = [Counter(s) for s in served]
        assert all(len(h) == 1 for h in homes), homes  # every turn of a session on one node
        assert {next(iter(h)) for h in homes} == {fqdn("hub-b"), fqdn("hub-c")}, homes  # sessions spread

        with entry.client(headers=entry.headers()) as c:
            rows = {r["id"]: r for r in c.get("/api/inference/pool/routing-log?limit=500").json()["entries"]}
        for session in rids:
            sections = [rows[rid]["affinity"] for rid in session]
            assert all(s["key"] == "header" and s["keySource"] == "metadata.user_id" for s in sections), sections
            assert sections[0]["outcome"] == "miss"
            assert all(s["outcome"] == "hit" and s["qualified"] for s in sections[1:]), sections
        # the session id itself is kept nowhere a person can read it
        assert "session_" not in str(rows)
