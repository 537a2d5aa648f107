"""F3: a node process SIGKILLed. Its peer marks it unreachable after exactly three failed
polls (1 s apart), keeps the pairing throughout, marks it connected again on the first good
poll after it restarts, and sends it no work while it is marked unreachable."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from history import History, run_op
from rig import Rig, chat_body

pytestmark = [pytest.mark.fault, pytest.mark.timeout(150)]

ROUTE = "/api/chat"


def test_f3_a_killed_node_is_unreachable_after_three_polls_and_back_on_the_first_good_one(tmp_path, report):
    with Rig(tmp_path, ["hub-a", "hub-b"], warm=("hub-b",)) as rig:
        a, b = rig.nodes["hub-a"], rig.nodes["hub-b"]
        b_fqdn = rig.fqdns["hub-b"]
        # hub-a's pin prefers hub-b: every request would go there while hub-a may send it
        a.op("POST", "/pins", {"scope": "default", "targetKind": "peer", "targetPeerId": a.peer_id("hub-b")})
        history = History()
        samples: list[tuple[float, str, int, bool]] = []  # (t, status, consecutiveFailures, paired)
        sent: list[tuple[float, float, object]] = []
        stop = threading.Event()

        def sample() -> None:
            for _ in range(2000):  # bounded: 2000 x 50 ms
                if stop.is_set():
                    return
                peers = {p["nodeFqdn"]: p for p in a.op("GET", "/peers")}
                p = peers.get(b_fqdn)
                t = time.monotonic()
                if p is None:
                    samples.append((t, "missing", -1, False))
                else:
                    samples.append((t, p["status"], p["consecutiveFailures"], p["authMode"] == "signed"))
                time.sleep(0.05)

        def load() -> None:
            with httpx.Client(timeout=15, trust_env=False) as c:
                for i in range(500):  # bounded: 500 x 150 ms
                    if stop.is_set():
                        return
                    t0 = time.monotonic()
                    op = run_op(c, history, "hub-a", a.url, ROUTE, chat_body(ROUTE, f"f3 {i}"))
                    sent.append((t0, time.monotonic(), op))
                    time.sleep(0.15)

        threads = [threading.Thread(target=sample, daemon=True), threading.Thread(target=load, daemon=True)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        killed = time.monotonic()
        b.kill()
        # wait for unreachable, then a little longer (no work may reach it meanwhile)
        deadline = killed + 15
        while time.monotonic() < deadline and not any(s[1] == "unreachable" for s in samples if s[0] > killed):
            time.sleep(0.05)
        time.sleep(2.0)
        b.start(ready_timeout=30)
        up = time.monotonic()
        deadline = up + 10
        while time.monotonic() < deadline and not any(s[1] == "connected" for s in samples if s[0] > up):
            time.sleep(0.05)
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(20)

        after_kill = [s for s in samples if s[0] > killed]
        first_unreachable = next((s for s in after_kill if s[1] == "unreachable"), None)
        back = next((s for s in samples if s[0] > up and s[1] == "connected"), None)
        assert first_unreachable is not None, after_kill[:40]
        assert back is not None, [s for s in samples if s[0] > up][:40]
        # exactly three failed polls: unreachable first shows with three strikes, and never before
        assert first_unreachable[2] == 3, first_unreachable
        assert all((s[1] == "unreachable") == (s[2] >= 3) for s in after_kill if s[0] < up), \
            [s for s in after_kill if s[0] < up]
        strikes_seen = sorted({s[2] for s in after_kill if s[0] < first_unreachable[0]})
        assert strikes_seen[-2:] == [1, 2] or strikes_seen[-1] == 2, strikes_seen
        to_unreachable = first_unreachable[0] - killed
        # the first failed poll comes within one interval of the kill, the third two intervals later
        assert 1.5 <= to_unreachable <= 4.5, to_unreachable
        # paired throughout: the row never left, and stayed signed
        assert all(s[3] for s in samples), [s for s in samples if not s[3]][:5]
        # back on the first good poll: within one interval (plus the sampler's step) of answering
        to_back = back[0] - up
        assert to_back <= 1.6 and back[2] == 0, (to_back, back)

        # no work sent to it while marked unreachable (the log says which nodes each request tried)
        log = {r["id"]: r for r in rig.log("hub-a")}
        marked = [(s0[0], s1[0]) for s0, s1 in zip(samples, samples[1:]) if s0[1] == s1[1] == "unreachable"]

        def within_unreachable(t0: float, t1: float) -> bool:
            return any(lo <= t0 and t1 <= hi for lo, hi in marked)

        checked, offenders = 0, []
        for t0, t1, op in sent:
            if op.rid and within_unreachable(t0, t1):
                checked += 1
                row = log[op.rid]
                tried = {row["node"], *row["failedOverFrom"], *(x["node"] for x in row["attempts"])}
                if b_fqdn in tried:
                    offenders.append(row)
        assert checked >= 5, checked
        assert not offenders, offenders[:3]
        # and before the kill and after the return hub-b served the pinned work
        assert any(op.served_by == b_fqdn and t0 > back[0] for t0, _, op in sent), "hub-b got work back"
        assert not history.lost(), [op.brief() for op in history.lost()]
        report("F3", {"killToUnreachableS": round(to_unreachable, 2), "upToConnectedS": round(to_back, 2),
                      "requests": len(sent), "requestsWhileUnreachable": checked,
                      "strikesSeen": strikes_seen + [3]})
