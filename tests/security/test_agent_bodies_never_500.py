"""Issue 25: the door judges only what no engine could serve, so whatever an agent sends reaches
an engine, natively or translated, and nothing it sends can make the node answer 500.

One node on loopback with a llama-server-like simulator serving the agent dialects natively
(native:8b) and an Ollama-like one that speaks chat completions only (trans:8b, translated).
Hypothesis writes bodies from the fields the agents send (with values of every JSON type,
nested), and headers from the ones they send; every answer must be something other than a
500, and every error must be JSON in a shape a client reads.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import ExitStack

import httpx
import pytest
from harness import RunningNode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hubpool_sim import SimConfig, SimModel, run_in_thread

NATIVE, TRANSLATED = "native:8b", "trans:8b"
ROUTES = ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/chat/completions", "/api/chat")
#: top-level fields the three agents send (issue 25), and the SDKs' usual ones
FIELDS = ("messages", "system", "tools", "tool_choice", "max_tokens", "stream", "metadata", "thinking",
          "output_config", "context_management", "input", "instructions", "store", "include",
          "prompt_cache_key", "previous_response_id", "reasoning", "parallel_tool_calls", "text",
          "stream_options", "options", "temperature", "max_output_tokens", "stop_sequences")
EXAMPLES = int(os.environ.get("HUBPOOL_AGENT_FUZZ_EXAMPLES", "60"))

scalars = st.none() | st.booleans() | st.integers(-10, 70000) | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(("role", "content", "type", "text", "name", "id",
                                                              "input", "output", "call_id", "session_id",
                                                              "input_schema", "parameters", "arguments",
                                                              "tool_use_id", "cache_control", "source")),
                                             inner, max_size=5), max_leaves=12)
# well-formed turns mixed with odd ones: a system message inside messages, unknown roles
turns = st.lists(st.fixed_dictionaries({"role": st.sampled_from(("user", "assistant", "system", "developer",
                                                                  "robot", "tool")),
                                        "content": st.text(max_size=30) | json_values}), max_size=4)
items = st.lists(st.fixed_dictionaries({"type": st.sampled_from(("message", "function_call", "reasoning",
                                                                  "function_call_output", "custom_tool_call",
                                                                  "custom_tool_call_output", "item_reference")),
                                        "role": st.sampled_from(("user", "developer", "assistant")),
                                        "content": st.text(max_size=30) | json_values,
                                        "output": json_values, "call_id": st.text(max_size=8)}), max_size=4)
bodies = st.fixed_dictionaries(
    {"model": st.sampled_from((NATIVE, TRANSLATED))},
    optional={**{f: json_values for f in FIELDS}, "messages": turns | json_values, "input": items | json_values,
              "stream": st.sampled_from((True, False, 1, 0, "true", "yes", None))})
headers = st.fixed_dictionaries({}, optional={
    "anthropic-beta": st.lists(st.from_regex(r"[a-z0-9-]{3,40}", fullmatch=True), max_size=12).map(",".join),
    "anthropic-version": st.from_regex(r"[0-9-]{0,12}", fullmatch=True),
    "x-claude-code-session-id": st.from_regex(r"[A-Za-z0-9-]{0,80}", fullmatch=True),
    "session-id": st.from_regex(r"[A-Za-z0-9_-]{0,80}", fullmatch=True),
    "x-session-id": st.from_regex(r"[A-Za-z0-9_]{0,80}", fullmatch=True)})


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("never500")
    with ExitStack() as stack:
        native = stack.enter_context(run_in_thread(SimConfig(flavor="llamacpp", models=[SimModel(NATIVE)])))
        translated = stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel(TRANSLATED)])))
        yield stack.enter_context(RunningNode(root / "n", {"LLAMACPP_URL": native.url, "OLLAMA_URL": translated.url}))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
@given(route=st.sampled_from(ROUTES), body=bodies, extra=headers)
def test_nothing_an_agent_sends_makes_the_node_answer_500(node, caplog, route, body, extra):
    r = httpx.post(node.url + route, content=json.dumps(body).encode(), timeout=30,
                   headers={"Content-Type": "application/json", **extra})
    assert r.status_code != 500, (route, body, r.text[:500])
    if r.status_code >= 400:
        assert isinstance(r.json(), dict), (route, body, r.text[:500])
    # nor a traceback in the node's log: a stage or translator that raised is a bug here too
    broken = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR
              and rec.name.startswith("hubpool")]
    assert not broken, (route, body, broken)
