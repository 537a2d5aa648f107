"""Three nodes, two concurrent sessions of each real client: every turn of a session lands on
one node, the two sessions land on different nodes, and the routing log names the client's own
session id as the affinity key's source (spec: Prefix affinity; issue 25: sessions from every
agent's own id).

hub-a is the entry and holds no engine; hub-b and hub-c each hold the model on a simulated
llama-server that asks for one file read per session (so a session is at least two turns) and
takes about 6 s a request. Both sessions start together: whichever first request arrives second
finds the other's node busy, and the queue-depth ranking sends it to the idle one. The entry
ranks by queue depth alone (poolTtftRanking 0, the spec's ranking): with the predicted-TTFT
ranking, evidence from earlier turns (a tool call is answered only when whole, so its first
byte comes late) can make one node look faster and take both sessions, which is that ranking
working, not what this test is about. A tap between the clients and hub-a records, per
request, the client's own session header and the node that served it (``X-Hub-Pool-Served-By``):
that is how a turn is told to a session, since the routing log, rightly, keeps no session id.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack

import pytest
from aiohttp_thread import ThreadedApp
from harness import affinity_pool, fqdn
from real_clients.agents import AGENTS, AgentRun
from real_clients.support import MODEL, aliases, handout, routing_rows, sim_config
from real_clients.tap import tap
from real_clients.test_tool_session import PROMPT, read_step

from hubpool_sim import run_in_thread

pytestmark = [pytest.mark.real_clients, pytest.mark.timeout(600)]

#: the header each client names its session with, and the keySource the routing log must show
SESSION_HEADER = {"claude-code": "x-claude-code-session-id", "codex": "session-id", "opencode": "x-session-id"}
KEY_SOURCES = {"claude-code": {"x-claude-code-session-id"}, "codex": {"session-id"},
               "opencode": {"x-session-id"}}
#: per token: a turn of the scripted model's eight tokens takes about 6 s, far longer than the
#: two clients' start-ups differ
DECODE_MS = 750


def _timeline(sessions: dict[str, list[dict]], rows: dict[str, dict]) -> str:
    """Every request of both sessions in order: when (s), which session, how long, where, and
    the placement sections of its routing-log row that decided it."""
    t0 = min(r["started"] for records in sessions.values() for r in records)
    lines = []
    for sid, records in sessions.items():
        for r in records:
            row = rows.get(r["answer_headers"].get("x-hub-pool-request-id"), {})
            lines.append((round(r["started"] - t0, 2), sid[-6:], round(r.get("ended", r["started"]) - r["started"], 2),
                          r["answer_headers"].get("x-hub-pool-served-by"),
                          {k: row.get(k) for k in ("candidates", "affinity", "ttft", "contention", "slots")}))
    return "\n".join(map(str, sorted(lines, key=lambda line: line[0])))


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    with ExitStack() as stack:
        sims = {name: stack.enter_context(run_in_thread(sim_config(agent_routes=True, decode_ms_per_token=DECODE_MS)))
                for name in ("hub-b", "hub-c")}
        entry = affinity_pool(stack, root, {name: sim.url for name, sim in sims.items()}, MODEL)["hub-a"]
        with entry.client(headers=entry.headers()) as c:
            assert c.patch("/api/inference/pool/settings", json={"poolTtftRanking": 0}).status_code == 200
        kept: list[dict] = []
        wire = stack.enter_context(ThreadedApp(tap(entry.url, kept)))
        yield entry, sims, wire, kept


@pytest.mark.parametrize("agent", AGENTS)
def test_two_sessions_of_each_client_stay_each_on_one_node_and_spread(agent, pool, agent_binaries, tmp_path):
    entry, sims, wire, kept = pool
    kept.clear()
    # the same task in the same repository twice, each session with its own home: the same
    # prompt, so only the clients' own session ids can tell the two apart. Configured from the
    # entry's handout, pointed at the tap in front of it.
    work = tmp_path / "repo"
    work.mkdir()
    (work / "notes.txt").write_text("the notes of the shared repository\n")
    setup_handout = {**handout(entry), "anthropicBaseUrl": wire.url}
    runs = [AgentRun(agent, agent_binaries[agent], tmp_path / f"session-{i}", setup_handout, work=work,
                     aliases=aliases(entry)) for i in range(2)]
    for sim in sims.values():
        sim.configure(tool_script=[read_step(work)])
    turns: list = [None, None]

    def session(i: int) -> None:
        turns[i] = runs[i].run(PROMPT, timeout=400)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(450)
    for sim in sims.values():
        sim.configure(tool_script=[])
    for turn in turns:
        assert turn is not None and turn.succeeded, turn.describe() if turn else "no turn"

    header = SESSION_HEADER[agent]
    sessions: dict[str, list[dict]] = {}
    for record in kept:
        if record["method"] == "POST":
            value = next((v for k, v in record["headers"].items() if k.lower() == header), None)
            assert value, f"{agent} sent a request without its {header} header: {record['path']}"
            sessions.setdefault(value, []).append(record)
    assert len(sessions) == 2, list(sessions)
    homes = {}
    for sid, records in sessions.items():
        assert all(r["status"] == 200 for r in records), [(r["path"], r["status"]) for r in records]
        served = {r["answer_headers"]["x-hub-pool-served-by"] for r in records}
        assert len(records) >= 2 and len(served) == 1, (sid[:8], [r["answer_headers"] for r in records])
        homes[sid] = served.pop()
    rows = {r["id"]: r for r in routing_rows(entry)}
    assert set(homes.values()) == {fqdn("hub-b"), fqdn("hub-c")}, _timeline(sessions, rows)  # the sessions spread
    for records in sessions.values():
        sections = [rows[r["answer_headers"]["x-hub-pool-request-id"]]["affinity"] for r in records]
        assert all(s and s["key"] == "header" and _normal(s["keySource"]) in KEY_SOURCES[agent]
                   for s in sections), sections
        assert [s["outcome"] for s in sections][1:] == ["hit"] * (len(sections) - 1), sections
    # the session ids themselves are kept nowhere a person can read them
    assert not any(sid in str(rows) for sid in sessions)
