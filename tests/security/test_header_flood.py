"""A flood of refused /local/* requests with huge headers (issue 26 item 2).

An unauthenticated caller's request to ``/local/*`` is refused by the peer guard on its
headers alone, and every refusal is an inbound routing-log row. Before issue 26 that row kept
the caller's ``X-Hub-Pool-Model`` uncut (thirty 2 MiB headers kept 2,097,152-character model
names), took the caller's ``X-Hub-Pool-Request-Id`` (replacing the row of a real decision under
that id), and sat in the one ring of decisions (201 refusals pushed every decision out).

Now: every string the log keeps is at most 300 characters; an unauthenticated refusal is kept
in a ring of its own (50 rows) under an id the node mints, and counted. The RSS this costs a
node process is measured in test_stranger_memory.py.
"""

from __future__ import annotations

import json

import httpx
import pytest
from harness import RunningNode

from fuzz.targets import strings_in
from hubpool_core.telemetry.routing_log import MAX_TEXT, REFUSAL_CAPACITY
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
MIB = 1024 * 1024


@pytest.fixture
def node(tmp_path):
    with run_in_thread(SimConfig(flavor="ollama", models=[SimModel("m:1b")])) as sim, \
            RunningNode(tmp_path / "n", {"OLLAMA_URL": sim.url}) as n:
        yield n


def _log(node) -> dict:
    with node.client(headers=node.headers()) as c:
        r = c.get(P + "/routing-log?limit=10000")
    assert r.status_code == 200, r.text
    return r.json()


def test_a_flood_of_refusals_keeps_every_decision_whole_and_holds_nothing_long(node):
    with httpx.Client(base_url=node.url, timeout=30, trust_env=False) as c:
        decisions = []
        for i in range(5):
            r = c.post("/api/chat", json={"model": "m:1b", "stream": False, "messages": [{"role": "user",
                                                                                         "content": f"q{i}"}]})
            assert r.status_code == 200, r.text
            decisions.append(r.headers["x-hub-pool-request-id"])
        before = {e["id"]: e for e in _log(node)["entries"]}
        assert set(decisions) <= set(before)
        flood = 200 + 10  # more than the whole ring of decisions
        for i in range(flood):
            big = i >= flood - 30  # the thirty 2 MiB model names, among the refusals still held
            r = c.post(P + "/local/api/chat", content=b"{}", headers={
                "X-Hub-Pool-Model": ("m" * (2 * MIB)) if big else f"probe-{i}",
                # a caller-chosen id naming a real decision's row
                "X-Hub-Pool-Request-Id": decisions[i % len(decisions)],
                "X-Hub-Pool-Backend": "ollama"})
            assert r.status_code == 401, r.text
    after = _log(node)
    rows = {e["id"]: e for e in after["entries"]}
    # every decision is still there, and is still the decision (not a refusal under its id)
    for rid in decisions:
        assert rows[rid] == before[rid], rid
    refused = [e for e in after["entries"] if e["status"] == 401]
    assert len(refused) == REFUSAL_CAPACITY  # the newest refusals, no more
    assert not {e["id"] for e in refused} & set(decisions)
    assert all(e["direction"] == "inbound" and e["node"] is None and e["outcome"] == "failed" for e in refused)
    assert after["summary"]["unauthenticatedRefusals"] == flood
    assert after["summary"]["totalRecorded"] == len(decisions)  # refusals are not decisions
    longest = max(len(s) for s in strings_in(after["entries"]))
    assert longest == MAX_TEXT  # the 2 MiB model names, cut
    # what the ring holds, measured: every string it keeps, in characters
    held = sum(len(s) for s in strings_in(list(node.node.routing_log.rows.values())
                                        + list(node.node.routing_log.refusals)))
    print("\nheader-flood-ring: " + json.dumps({
        "refusals": flood, "bigModelHeaders": 30, "bigHeaderBytes": 2 * MIB, "rowsHeld": len(after["entries"]),
        "refusalsHeld": len(refused), "longestString": longest, "charactersHeld": held}))
    assert held <= len(after["entries"]) * 40 * MAX_TEXT  # forty fields of 300 at the very most


def test_an_unauthenticated_refusal_mints_its_own_id(node):
    """The id a stranger names is never a row's: not when it matches nothing either, so a
    later real forward under that id cannot meet a stranger's row."""
    chosen = "abc-chosen-by-the-caller"
    r = httpx.post(node.url + P + "/local/api/chat", content=b"{}", timeout=30,
                   headers={"X-Hub-Pool-Request-Id": chosen, "X-Hub-Pool-Model": "m:1b"})
    assert r.status_code == 401
    entries = _log(node)["entries"]
    assert len(entries) == 1 and entries[0]["id"] != chosen and entries[0]["model"] == "m:1b"
