"""The operator's pool verbs through the real CLI against real nodes on loopback: status,
log, pin/unpin, enable/disable, peers — text layouts, --json, and honest env overrides."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import ExitStack

import httpx
import pytest
from harness import RunningNode, fqdn, make_pool, pair

from hubpool_core.cli.format import counts_line, peer_context, peer_engines, peer_status
from hubpool_core.cli.status_commands import _peers
from hubpool_core.telemetry.annotations import annotations
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
CHAT = {"messages": [{"role": "user", "content": "hello"}], "stream": False}
NEW_COMMANDS = ["status", "log", "pin", "unpin", "enable", "disable", "peers"]


def cli(node, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("HUB_POOL_ASSUME_YES", "CI_HUB_ASSUME_YES")}
    environ.update({"HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
                    "COLUMNS": "200", **(env or {})})
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env=environ, timeout=60, stdin=subprocess.DEVNULL)


def ok(node, *args: str, **kw) -> str:
    r = cli(node, *args, **kw)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    return r.stdout


def refused(node, *args: str, **kw) -> str:
    r = cli(node, *args, **kw)
    assert r.returncode == 1, (args, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def line(text: str, start: str) -> str:
    """The one line of ``text`` that starts with ``start``."""
    found = [ln for ln in text.splitlines() if ln.startswith(start)]
    assert len(found) == 1, (start, text)
    return found[0]


def block(text: str, title: str) -> list[str]:
    """The lines under a block title, up to the next blank line."""
    lines = text.splitlines()
    i = lines.index(title)
    out = []
    for ln in lines[i + 1:]:
        if not ln.strip():
            break
        out.append(ln)
    return out


def chat(node, model, **kw):
    return httpx.post(node.url + "/api/chat", json={"model": model, **CHAT}, timeout=kw.pop("timeout", 60), **kw)


def poll(*nodes):
    for n in nodes:
        n.run(n.node.health.poll_once())


@pytest.fixture
def pool(tmp_path):
    """hub-a (Ollama: llama3.2:3b, a-only:1b) and hub-b (vLLM: llama3.2:3b, qwen3:8b), paired with a PIN."""
    with ExitStack() as stack:
        sims = {
            "hub-a": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[
                SimModel("llama3.2:3b"), SimModel("a-only:1b")], decode_ms_per_token=0))),
            "hub-b": stack.enter_context(run_in_thread(SimConfig(flavor="vllm", models=[
                SimModel("llama3.2:3b"), SimModel("qwen3:8b")], decode_ms_per_token=0))),
        }
        engines = {"hub-a": {"OLLAMA_URL": sims["hub-a"].url}, "hub-b": {"VLLM_URL": sims["hub-b"].url}}
        # the tests poll by hand (poll()): a background tick landing between a stop and a status
        # read would add a strike the test did not make ("connected 1/3" read 2/3)
        nodes = make_pool(tmp_path, list(sims), environ={"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "300"},
                          per_node=engines)
        for n in nodes.values():
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        pair(a, b)
        poll(a, b)
        poll(a, b)
        yield nodes, sims
        for n in nodes.values():
            if n.thread.is_alive():
                n.stop()


# -- status -----------------------------------------------------------------------------

def test_status_prints_every_block_and_json_is_the_raw_answer(pool):
    nodes, _ = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    op(a, "POST", "/pairing-pin")
    text = ok(a, "status")
    assert line(text, "Pooling ") == "Pooling       ✓ active — routing with 1 connected peer"
    assert line(text, "Outbound ") == "Outbound      on — this node may send work to peers"
    assert line(text, "Inbound ") == "Inbound       on — this node serves work peers send it"
    assert line(text, "Peers ") == "Peers         1 total · 1 connected · 0 pending · 0 unreachable · 0 disabled"
    assert "no Tailscale Admin API credential" in line(text, "Discovery ")
    assert line(text, "Settings ") == ("Settings      poolEnabled=true · outbound=true · inbound=true · "
                                       "localAffinity=1 · healthPoll=30s")
    assert line(text, "Routing log ") == "Routing log   0/200 recorded · 0 served · 0 failed · 0 failovers"
    assert line(text, "Database ").startswith("Database      sqlite at sqlite:///")
    assert line(text, "Database ").endswith("hubpool.db — answering")
    assert line(text, "History ").startswith("History       off (HUB_POOL_HISTORY=sqlite")

    me = block(text, "This node")
    fingerprint = op(a, "GET", "/status")["localNode"]["identity"]["publicKeyFingerprint"]
    assert me[0] == f"  Node          {fqdn('hub-a')}"
    assert me[1] == "  Tailscale     connected · tailnet example-tailnet.ts.net"
    assert "  In flight     0" in me
    engines = [ln for ln in me if "ollama" in ln]
    assert len(engines) == 1 and engines[0].startswith("  Engines       ollama   ✓ 2")
    assert any(ln.split()[:3] == ["vllm", "✗", "0"] for ln in me)  # the dead local vLLM URL, with its error
    assert f"  Identity      key fingerprint {fingerprint}" in me
    assert any(ln.startswith("  Pairing       PIN outstanding until ") and ln.endswith("Z") for ln in me)

    assert block(text, "Pins") == ["  none — the ranker alone decides (`hubpool pin <node|local> [--model ID]` "
                                   "adds one)"]
    peers = block(text, "Peers")
    assert peers[0].split() == ["ID", "NODE", "DIR", "STATUS", "LAST", "SEEN", "QUEUE", "CONTEXT", "ENGINES"]
    header = peers[0]
    assert [header.index(c) for c in ("NODE", "DIR", "STATUS", "LAST SEEN", "QUEUE", "CONTEXT", "ENGINES")] == \
        [9, 44, 49, 66, 87, 93, 101]  # ID(8) NODE(34) DIR(4) STATUS(16) LAST SEEN(20) QUEUE(5) CONTEXT(7)
    row = peers[1]
    b_id = a.node.peers.by_fqdn(fqdn("hub-b")).id
    assert row[:9] == b_id[:8] + " " and row[9:].split()[:4] == [fqdn("hub-b"), "out", "connected",
                                                                 row[66:86].split()[0]]
    assert row[66:86].rstrip().endswith("Z") and row[87:92].strip() == "0"
    assert row[93:100].strip() == "none" and row[101:] == "vllm(2)"
    assert line(text, "Peer auth ") == ("Peer auth     every peer signs its requests — poolRequireSignedPeers is "
                                        "safe to turn on")
    assert "Peers refusing this Hub" not in text

    data = json.loads(ok(a, "status", "--json"))
    assert data["reason"] == "active" and data["peers"][0]["nodeFqdn"] == fqdn("hub-b")
    assert set(data) == set(op(a, "GET", "/status"))

    # a disabled peer, then one failing its polls
    op(a, "POST", f"/peers/{b_id}/disable")
    text = ok(a, "status")
    assert "1 disabled" in line(text, "Peers ") and "connected/off" in block(text, "Peers")[1]
    assert line(text, "Pooling ") == "Pooling       ○ partly disabled — every connected peer is switched off here"
    op(a, "POST", f"/peers/{b_id}/enable")
    b.stop()
    poll(a)
    assert "connected 1/3" in block(ok(a, "status"), "Peers")[1]
    assert "connected 1/3" in ok(a, "peers")


def test_a_peer_that_refuses_this_hub_is_listed_with_its_action(pool):
    nodes, _ = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    port, data_dir, environ = b.port, b.env.data_dir, b.environ
    b.stop()
    (data_dir / "hubpool.db").unlink()
    for leftover in data_dir.glob("hubpool.db-*"):
        leftover.unlink()
    (data_dir / "node.secret").unlink()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    nodes["hub-b"] = RunningNode(data_dir, environ, sock=sock).start()
    poll(a)
    text = ok(a, "status")
    assert "identity changed" in block(text, "Peers")[1]
    refusing = block(text, "Peers refusing this Hub")
    assert fqdn("hub-b") in refusing[0] and "identity changed (HTTP 401" in refusing[0]
    assert f"`hubpool unpair {fqdn('hub-b')}`" in refusing[1]
    assert "identity changed" in ok(a, "peers")


def test_peers_has_the_status_columns_plus_auth(pool):
    nodes, _ = pool
    a = nodes["hub-a"]
    text = ok(a, "peers")
    header, row = text.splitlines()[:2]
    assert header.split() == ["ID", "NODE", "DIR", "STATUS", "LAST", "SEEN", "QUEUE", "CONTEXT", "ENGINES", "AUTH"]
    assert row.split()[1:4] == [fqdn("hub-b"), "out", "connected"] and row.split()[-2:] == ["vllm(2)", "signed"]
    assert json.loads(ok(a, "peers", "--json"))[0]["nodeFqdn"] == fqdn("hub-b")


# -- log --------------------------------------------------------------------------------

def test_log_shows_failover_hang_up_and_refusal_lines(pool):
    nodes, sims = pool
    a = nodes["hub-a"]
    assert "no pin" not in ok(a, "pin", fqdn("hub-b"), "--model", "llama3.2:3b")
    sims["hub-b"].add_fault("error:503", count=1)
    r = chat(a, "llama3.2:3b")
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local"
    ok(a, "unpin", "--model", "llama3.2:3b")

    sims["hub-a"].add_fault("hang", count=1)
    with pytest.raises(httpx.ReadTimeout):
        chat(a, "a-only:1b", timeout=1)
    deadline = time.monotonic() + 10
    while not op(a, "GET", "/routing-log")["summary"]["clientClosed"] and time.monotonic() < deadline:
        time.sleep(0.05)

    sims["hub-a"].add_fault("error:400", count=1)
    assert chat(a, "a-only:1b").status_code == 400

    text = ok(a, "log")
    lines = text.splitlines()
    assert lines[0] == ("Routing log   3/200 recorded · 1 served · 2 failed (1 abandoned by the caller, "
                        "1 refused as a bad request) · 1 failover")
    assert lines[1].startswith("Last decision ") and lines[1].endswith("Z") and len(lines[1]) == 34
    header = lines[3]
    assert [header.index(c) for c in ("DIR", "MODEL", "NODE", "ATT", "MS", "TOTAL", "OUTCOME")] == \
        [21, 26, 47, 82, 88, 96, 105]  # TIME(20) DIR(4) MODEL(20) NODE(34) ATT(5) MS(7) TOTAL(8)
    rows = [i for i, ln in enumerate(lines) if ln[:4].isdigit()]
    assert len(rows) == 3
    refused_row, closed_row, failed_over_row = rows  # newest first
    assert lines[refused_row].split()[2:5] == ["out", "a-only:1b", "local"]
    assert lines[refused_row].endswith("✗ failed 400")
    assert lines[refused_row + 1] == ("  ↳ refused by the engine (HTTP 400) — passed to the app as the request's "
                                      "fault")
    assert lines[closed_row].endswith("✗ failed -")
    ms = int(lines[closed_row][88:95])
    assert 900 <= ms < 5000
    assert lines[closed_row + 1] == (f"  ↳ the app closed its connection after {ms} ms; local had not answered yet "
                                     "— not a routing failure")
    assert lines[failed_over_row].split()[2:6] == ["out", "llama3.2:3b", "local", "2/2"]
    assert lines[failed_over_row].endswith("✓ served 200")
    assert lines[failed_over_row + 1] == "  ↳ pinned: a model pin put a peer first (prefer)"
    assert lines[failed_over_row + 2] == f"  ↳ failed over from {fqdn('hub-b')} (HTTP 503)"

    status = ok(a, "status")
    assert line(status, "Routing log ") == lines[0]

    assert len([ln for ln in ok(a, "log", "--limit", "1").splitlines() if ln[:4].isdigit()]) == 1
    data = json.loads(ok(a, "log", "--json", "--limit", "2"))
    assert len(data["entries"]) == 2 and data["summary"]["clientClosed"] == 1
    assert "from 1 to 200" in refused(a, "log", "--limit", "0")
    assert "from 1 to 200" in refused(a, "log", "--limit", "201")


def test_log_on_an_empty_node(tmp_path):
    with RunningNode(tmp_path / "n") as n:
        text = ok(n, "log")
        assert text.splitlines()[:2] == ["Routing log   0/200 recorded · 0 served · 0 failed · 0 failovers",
                                         "Last decision none yet"]
        assert "No routing decisions" in text


# -- pins -------------------------------------------------------------------------------

def test_pin_and_unpin_round_trip_through_status(pool):
    nodes, _ = pool
    a = nodes["hub-a"]
    b_id = a.node.peers.by_fqdn(fqdn("hub-b")).id
    out = ok(a, "pin", b_id[:8], "--model", "qwen3:8b")
    assert f"Pinned model qwen3:8b to {fqdn('hub-b')}" in out and "cannot serve" not in out
    assert "Pinned every model (default pin) to this node (local)" in ok(a, "pin", "local")
    odd = "hf.co/org/Model-GGUF:Q4_K_M"
    out = ok(a, "pin", "hub-b", "--model", odd)  # short host name; this model is nowhere
    assert "cannot serve that right now" in out
    pins = block(ok(a, "status"), "Pins")
    assert pins[0].split() == ["SCOPE", "TARGET", "NOW"]
    assert pins[1].split() == ["qwen3:8b", "prefer", fqdn("hub-b"), "available"]
    assert pins[2].split() == ["every", "model", "(default)", "prefer", "local", "available"]
    assert pins[3].split()[:3] == [odd, "prefer", fqdn("hub-b")] and "not available" in pins[3]

    assert ok(a, "unpin", "--model", odd).strip() == f"Removed the pin for {odd}."
    assert ok(a, "unpin", "--model", "qwen3:8b").strip() == "Removed the pin for qwen3:8b."
    assert ok(a, "unpin", "--model", "qwen3:8b").strip() == "There was no pin for qwen3:8b; nothing changed."
    pins = block(ok(a, "status"), "Pins")
    assert len(pins) == 2 and "every model (default)" in pins[1]
    assert json.loads(ok(a, "unpin", "--json")) == {"pins": []}
    assert block(ok(a, "status"), "Pins")[0].startswith("  none")
    answer = json.loads(ok(a, "pin", fqdn("hub-b"), "--json"))
    assert answer["pins"] == [{"scope": "default", "model": None, "targetKind": "peer", "targetPeerId": b_id,
                               "mode": "prefer"}]
    assert "no pool peer" in refused(a, "pin", "nowhere")


# -- kill switches --------------------------------------------------------------------

def test_enable_and_disable_with_and_without_yes(pool):
    nodes, _ = pool
    a = nodes["hub-a"]
    assert "--yes" in refused(a, "disable")
    assert op(a, "GET", "/settings")["poolEnabled"] is True
    out = ok(a, "disable", "--yes")
    assert out.splitlines() == ["poolEnabled is now false.",
                                "Pooling       ✗ disabled — settings (poolEnabled=false)"]
    status = ok(a, "status")
    assert line(status, "Outbound ") == "Outbound      off — poolEnabled=false in settings"
    out = ok(a, "enable", "--outbound", "--yes")
    assert out.splitlines()[0] == ("poolOutboundEnabled was already true, but poolEnabled=false in settings keeps "
                                   "pooling off: nothing changed in what this node does.")
    assert "`hubpool enable`" in out
    assert ok(a, "enable", env={"HUB_POOL_ASSUME_YES": "1"}).splitlines() == [
        "poolEnabled is now true.", "Pooling       ✓ active — routing with 1 connected peer"]
    assert "at most one" in refused(a, "enable", "--outbound", "--inbound", "--yes")
    out = ok(a, "disable", "--inbound", "--yes")
    assert out.splitlines() == ["poolInboundEnabled is now false.", "Pooling       ○ partly disabled — inbound off"]
    assert line(ok(a, "status"), "Inbound ") == "Inbound       off — poolInboundEnabled=false in settings"
    data = json.loads(ok(a, "enable", "--inbound", "--yes", "--json"))
    assert data["directions"]["inbound"] == {"enabled": True, "disabledBy": None}
    assert data["settings"]["poolInboundEnabled"] is True


def test_an_environment_flag_is_reported_honestly(tmp_path):
    with RunningNode(tmp_path / "off", {"HUB_POOL_USER_DISABLED": "true"}) as n:
        status = ok(n, "status")
        assert line(status, "Pooling ") == "Pooling       ✗ disabled — env (HUB_POOL_USER_DISABLED=true)"
        assert line(status, "Inbound ") == ("Inbound       off — HUB_POOL_USER_DISABLED=true in this node's "
                                            "environment")
        out = ok(n, "enable", "--yes").splitlines()
        assert out[0] == ("poolEnabled was already true, but HUB_POOL_USER_DISABLED=true in this node's environment "
                          "keeps pooling off: nothing changed in what this node does.")
        assert "Remove that flag" in out[1]
        assert ok(n, "disable", "--yes").splitlines()[:2] == [
            "poolEnabled is now false.",
            "(HUB_POOL_USER_DISABLED=true in this node's environment keeps it off as well.)"]
        assert ok(n, "enable", "--yes").splitlines()[0].startswith(
            "poolEnabled is now true, but HUB_POOL_USER_DISABLED=true in this node's environment keeps pooling off")
    with RunningNode(tmp_path / "out", {"HUB_POOL_OUTBOUND_DISABLED": "true"}) as n:
        assert line(ok(n, "status"), "Outbound ") == ("Outbound      off — HUB_POOL_OUTBOUND_DISABLED=true in this "
                                                      "node's environment")
        out = ok(n, "enable", "--outbound", "--yes").splitlines()
        assert out[0] == ("poolOutboundEnabled was already true, but HUB_POOL_OUTBOUND_DISABLED=true in this node's "
                          "environment keeps outbound pooling off: nothing changed in what this node does.")
        assert out[-1] == "Pooling       ○ partly disabled — outbound off"


# -- help -------------------------------------------------------------------------------

@pytest.mark.parametrize("command", NEW_COMMANDS)
def test_every_pool_command_has_help(command):
    r = subprocess.run([sys.executable, "-m", "hubpool_core.cli", command, "--help"], capture_output=True,
                       text=True, env={**os.environ, "COLUMNS": "120"}, timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "Usage:" in r.stdout and "--json" in r.stdout and "--url" in r.stdout


# -- formatting, on payloads a loopback pool does not produce --------------------------

def test_counts_line_breaks_out_every_kind_of_failure():
    summary = {"recorded": 9, "capacity": 200, "served": 4, "failed": 5, "pending": 0, "failovers": 2,
               "clientClosed": 1, "requestErrors": 2, "outputFaults": 2}
    assert counts_line(summary) == ("9/200 recorded · 4 served · 5 failed (1 abandoned by the caller, 2 refused as "
                                    "bad requests, 2 bad answers) · 2 failovers")
    hang_ups = {"recorded": 4, "capacity": 200, "served": 0, "failed": 4, "failovers": 0, "clientClosed": 4}
    assert counts_line(hang_ups) == "4/200 recorded · 0 served · 4 failed (4 abandoned by the caller) · 0 failovers"


def test_peer_cells_and_refusals():
    caps = {"backends": [{"type": "vllm", "healthy": True, "modelsLoaded": ["a", "b"]},
                         {"type": "ollama", "healthy": False, "modelsLoaded": []}], "maxNumCtx": 32768}
    assert peer_engines({"lastCapabilities": caps}) == "vllm(2) ollama(✗)"
    assert peer_engines({"lastCapabilities": {"backends": [], "acceptingWork": False}}) == "not accepting work"
    assert peer_context({"lastCapabilities": caps}) == "32768" and peer_context({}) == "?"
    assert peer_status({"status": "connected", "enabled": True, "consecutiveFailures": 2}) == "connected 2/3"
    assert peer_status({"status": "unreachable", "enabled": True, "consecutiveFailures": 7,
                        "probeFailure": {"kind": "unreachable"}}) == "unreachable"
    assert peer_status({"status": "connected", "enabled": True, "consecutiveFailures": 1,
                        "probeFailure": {"kind": "unauthorized"}}) == "credentials refused 1/3"
    peers = [{"id": "1234567890", "nodeFqdn": "x.example-tailnet.ts.net", "direction": "inbound",
              "status": "connected", "enabled": True, "consecutiveFailures": 1, "authMode": "bearer",
              "probeFailure": {"kind": "unauthorized", "httpStatus": 401, "since": "2026-09-16T10:00:00.000Z",
                               "attempts": 2, "action": "run `hubpool unpair <peer>`"}}]
    lines = _peers({"peers": peers, "settings": {"poolRequireSignedPeers": False}})
    auth = next(ln for ln in lines if ln.startswith("Peer auth"))
    assert "still on bearer tokens: x.example-tailnet.ts.net" in auth and "keep poolRequireSignedPeers off" in auth
    i = lines.index("Peers refusing this Hub")
    assert lines[i + 1] == ("  12345678 x.example-tailnet.ts.net: credentials refused (HTTP 401, since "
                            "2026-09-16 10:00:00Z, 2 attempts)")
    assert lines[i + 2] == "    run `hubpool unpair x.example-tailnet.ts.net`"


@pytest.mark.parametrize("signature,words", [
    ("no-user-query", "no user turn in the conversation"),
    ("missing-messages", "a chat body with no messages"),
    ("invalid-message", "a malformed message"),
    ("context-length", "prompt longer than the context window"),
    ("chat-template", "a chat template that would not render"),
])
def test_request_errors_print_in_words(signature, words):
    row = {"direction": "outbound", "node": "local", "outcome": "failed", "status": 400, "reason": "HTTP 500",
           "requestError": {"signature": signature, "basis": "definitive", "confirms": None}}
    assert annotations(row) == [f"refused as a bad request: {words} (no node could have answered it)"]


def test_output_faults_and_a_walk_that_ran_out():
    cut = {"direction": "outbound", "node": "local", "outcome": "failed", "status": 200,
           "requestError": {"signature": "truncated-upstream", "basis": "node", "confirms": None}}
    assert annotations(cut) == ["bad answer from local: the node's answer was cut off — the node's fault, not the "
                                "request's"]
    ran_out = {"direction": "outbound", "node": "b", "outcome": "failed", "status": 502, "reason": "HTTP 503",
               "failedOverFrom": ["local", "b"], "attempts": [{"reason": "fetch failed (ECONNREFUSED)"},
                                                            {"reason": "HTTP 503"}]}
    assert annotations(ran_out) == ["failed over from local (fetch failed (ECONNREFUSED)), b (HTTP 503)",
                                    "every candidate failed; the last: HTTP 503"]

