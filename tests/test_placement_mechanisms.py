"""Issue 27's placement mechanisms through three running nodes on equal boxes (docs/placement.md):
shared-prefix placement (a block-hash index of what each engine was sent: a new session of a
fleet goes where its shared head is held) and spreading sessions (a new session whose best
predictions tie goes to the engine holding the fewest for its slots, not to the entry node's
head start), and the hop a peer costs priced into its prediction. Engines are llama-server-shaped simulators of one speed, reporting slots and timings, on a
clock ten times faster than real time."""

from __future__ import annotations

import threading
from contextlib import ExitStack, contextmanager

import httpx
import pytest
from harness import fqdn, make_pool, meshed, wait_until

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
MODEL = "chat:8b"
NAMES = ["hub-a", "hub-b", "hub-c"]


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def chat(node, messages, max_tokens=2):
    r = httpx.post(node.url + "/v1/chat/completions", timeout=60, trust_env=False,
                   json={"model": MODEL, "max_tokens": max_tokens, "stream": True, "messages": messages})
    assert r.status_code == 200, r.text
    return r


def row(node, response):
    rid = response.headers["x-hub-pool-request-id"]
    return next(e for e in op(node, "GET", "/routing-log?limit=500")["entries"] if e["id"] == rid)


def served(response, entry: str = "hub-a") -> str:
    by = response.headers["x-hub-pool-served-by"]
    return entry if by == "local" else by.split(".", 1)[0]


@contextmanager
def own_app_fills(node, sim, max_tokens, label, count=2):
    """The node's own app pins its work local and fills ``count`` slots of its engine with
    answers of ``max_tokens``; the block runs while they hold the slots, and waits for them after."""
    op(node, "POST", "/pins", {"scope": "default", "targetKind": "local"})
    held = [threading.Thread(target=chat, args=(node, [{"role": "user", "content": text(f"{label} {i}", 100)}]),
                             kwargs={"max_tokens": max_tokens}) for i in range(count)]
    for t in held:
        t.start()
    try:
        assert wait_until(lambda: sim.stats()["in_flight"] == count, timeout=20)
        yield held
    finally:
        for t in held:
            t.join()


def text(label: str, tokens: int) -> str:
    words = f"{label} " * (tokens * 4 // (len(label) + 1) + 1)
    return words[:tokens * 4]


@pytest.fixture
def three(tmp_path):
    """hub-a, hub-b, hub-c: one 2-slot llama-server-shaped engine each, 2,000 prompt tokens a
    second, paired with one another; each has served one request of its own, so every node's
    speed is measured and advertised."""
    yield from started_three(tmp_path, {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1"})


@pytest.fixture
def three_slow_poll(tmp_path):
    """The same, the health poll five minutes apart (it runs only when the test asks) and the busy
    load poll every 100 ms."""
    yield from started_three(tmp_path, {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "300", "HUB_POOL_DEV_LOAD_POLL_MS": "100"})


@pytest.fixture
def three_stale(tmp_path):
    """The same, the health poll five minutes apart: hub-a knows its peers' load as of the last
    poll and what its own forwards and their answers said since (its busy load poll is off)."""
    for nodes_sims in started_three(tmp_path, {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "300"}):
        op(nodes_sims[0]["hub-a"], "PATCH", "/settings", {"poolLoadPollMs": 0})
        yield nodes_sims


@pytest.fixture
def unequal_slots(tmp_path):
    """The same, but hub-a and hub-b run four slots and hub-c one: three engines of one speed."""
    yield from started_three(tmp_path, {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1"}, {"hub-a": 4, "hub-b": 4, "hub-c": 1})


@pytest.fixture
def distant_peers(tmp_path):
    """Three equal boxes whose peers' round trips count a hundredfold on the engines' clock
    (HUB_POOL_DEV_CLOCK_SPEEDUP=100): a loopback hop priced as a distant peer's."""
    yield from started_three(tmp_path, {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1", "HUB_POOL_DEV_CLOCK_SPEEDUP": "100"})


@pytest.fixture
def one_slot_each(tmp_path):
    """Three one-slot engines of one speed decoding at 100 ms a token, the nodes' clock told the
    engines run ten times faster (HUB_POOL_DEV_CLOCK_SPEEDUP, as the bench tells them), the busy
    load poll every 100 ms."""
    yield from started_three(tmp_path, {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1", "HUB_POOL_DEV_LOAD_POLL_MS": "100",
                                        "HUB_POOL_DEV_CLOCK_SPEEDUP": "10"},
                             {n: 1 for n in NAMES}, decode_ms=100)


def started_three(tmp_path, environ, slots=None, decode_ms=20):
    with ExitStack() as stack:
        sims = {n: stack.enter_context(run_in_thread(SimConfig(
            flavor="llamacpp", slots=(slots or {}).get(n, 2), prefill_tps=2000, decode_ms_per_token=decode_ms,
            timings=True, prompt_cache=True,
            time_scale=0.1, name=n, models=[SimModel(MODEL, window=131072)]))) for n in NAMES}
        nodes = make_pool(tmp_path, NAMES, environ=environ,
                          per_node={n: {"LLAMACPP_URL": sims[n].url} for n in NAMES})
        a, b, c = meshed(stack, nodes, [MODEL])
        for name, n in nodes.items():  # each measures its own engine on a request of its own
            r = chat(n, [{"role": "user", "content": text(f"warm {name}", 600)}])
            assert served(r, name) == name
        # three polls each, so the hop is the median of steady round trips: a node's first signed
        # call to a peer it just paired with takes 100-250 ms and must stay a minority reading
        for _ in range(3):
            for n in (a, b, c):
                n.run(n.node.health.poll_once())
        yield nodes, sims


def test_a_fleets_new_session_goes_where_its_shared_head_is_held(three):
    nodes, sims = three
    a = nodes["hub-a"]
    head = text("the agent's system prompt and tools", 6000)
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-c")).id})
    first = chat(a, [{"role": "system", "content": head}, {"role": "user", "content": text("task one", 400)}])
    assert served(first) == "hub-c"
    op(a, "DELETE", "/pins?scope=default")
    second = chat(a, [{"role": "system", "content": head}, {"role": "user", "content": text("task two", 400)}])
    # another session (its head, system and first turn, differs), one prompt beginning with the
    # first: hub-c holds 6,000 of its tokens and reads the rest, 3 s sooner than anywhere else
    assert served(second) == "hub-c"
    predictions = {p["node"]: p for p in row(a, second)["ttft"]["predictions"]}
    assert predictions[fqdn("hub-c")]["cachedTokens"] >= 5_800
    assert predictions["local"]["cachedTokens"] == 0 and predictions[fqdn("hub-b")]["cachedTokens"] == 0
    assert sims["hub-c"].stats()["cached_tokens"] >= 5_800  # and the engine did hold it
    # with the index off, only the session's own engine is known to hold anything: a new
    # session of the fleet is placed as if no engine held its head
    op(a, "PATCH", "/settings", {"poolPrefixIndex": 0})
    third = chat(a, [{"role": "system", "content": head}, {"role": "user", "content": text("task three", 400)}])
    assert all(p["cachedTokens"] == 0 for p in row(a, third)["ttft"]["predictions"])


def test_a_full_engine_is_not_priced_as_still_holding_a_sessions_own_context(three):
    """hub-c holds a session's 80,000-token context (40 s to read on the engines' clock) when its own
    app fills both its slots with other prompts for about half a minute more. Priced as still holding
    the context, hub-c would be the soonest (the wait, then almost nothing to read); but the slot the
    next turn waits for ran another prompt, so hub-c is priced with nothing cached and the turn goes
    to an idle engine, which reads it in 40 s."""
    nodes, sims = three
    a, c = nodes["hub-a"], nodes["hub-c"]
    context = [{"role": "system", "content": text("the session's own context", 80_000)},
               {"role": "user", "content": "go"}]
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-c")).id})
    assert served(chat(a, context)) == "hub-c"
    op(a, "DELETE", "/pins?scope=default")
    # 1,500 tokens at 20 ms a token: each holds its slot 30 s on the engines' clock (3 s real)
    with own_app_fills(c, sims["hub-c"], 1500, "other"):
        a.run(a.node.health.poll_once())  # hub-a reads hub-c's count and schedule now
        turn = chat(a, [*context, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then"}])
        predictions = {p["node"]: p for p in row(a, turn)["ttft"]["predictions"]}
        full = predictions[fqdn("hub-c")]
        assert full["inFlight"] >= 2 and full["cachedTokens"] == 0, predictions
        assert full["prefillMs"] >= 39_000, predictions  # the whole context read again
        assert served(turn) != "hub-c", predictions


def test_new_sessions_spread_over_equal_boxes_instead_of_piling_on_the_entry_node(three):
    nodes, _ = three
    a = nodes["hub-a"]
    placed = []
    for i in range(3):
        r = chat(a, [{"role": "system", "content": text(f"agent {i}", 1500)}, {"role": "user", "content": "go"}])
        placed.append(served(r))
        section = row(a, r)["ttft"]
        spread = section.get("spread")
        assert spread is not None and len(spread["tied"]) == 3, [
            (p["node"], p["predictedMs"], p["prefillMs"], p["hopMs"], p["waitMs"]) for p in section["predictions"]]
    # three equal idle boxes: every prediction ties, and each new session goes to the box holding
    # the fewest (hub-a already holds its own warm-up prompt), not to the local head start
    assert sorted(placed) == NAMES and placed[-1] == "hub-a"
    # a session's next turn stays where its context is (it predicts seconds less there)
    follow = chat(a, [{"role": "system", "content": text("agent 0", 1500)}, {"role": "user", "content": "go"},
                      {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then"}])
    assert served(follow) == placed[0]
    # spreading off: the tie is settled by the predictions alone, as before (milliseconds apart)
    op(a, "PATCH", "/settings", {"poolSessionSpread": 0})
    r = chat(a, [{"role": "system", "content": text("agent 9", 1500)}, {"role": "user", "content": "go"}])
    section = row(a, r)["ttft"]
    best = min(section["predictions"], key=lambda p: p["predictedMs"])
    assert section.get("spread") is None and r.headers["x-hub-pool-served-by"] == best["node"]


def test_a_busy_node_learns_its_peers_load_sub_second_not_at_the_next_poll(three_slow_poll):
    """hub-b's own app fills both its slots after hub-a's last health poll; hub-a, busy, asks its
    peers' in-flight counts every 100 ms (poolLoadPollMs) and places around hub-b."""
    nodes, sims = three_slow_poll
    a, b = nodes["hub-a"], nodes["hub-b"]
    b_id = a.node.peers.by_fqdn(fqdn("hub-b")).id
    assert a.node.load.peer_load(b_id, 0) == 0  # hub-b idle at the last poll
    # 1,000 tokens at 20 ms a token on a clock ten times faster: each holds its slot 2 s. Few enough
    # that hub-b's slot clock plans on them: a larger ask, against its 2-token warm-up, is a ceiling
    # and its typical answer the plan, and hub-b states its slots free within a fraction of a second
    with own_app_fills(b, sims["hub-b"], 1000, "long") as held:
        # hub-a has work of its own in flight: busy
        own = threading.Thread(target=chat, args=(a, [{"role": "user", "content": text("a's own", 100)}]),
                               kwargs={"max_tokens": 1000})
        own.start()
        held.append(own)
        # (hub-a's own request may have gone to hub-b too: then it counts three)
        assert wait_until(lambda: a.node.load.peer_load(b_id, 0) >= 2, timeout=10)
        r = chat(a, [{"role": "system", "content": text("new session", 1500)}, {"role": "user", "content": "go"}])
        predictions = {p["node"]: p for p in row(a, r)["ttft"]["predictions"]}
        assert predictions[fqdn("hub-b")]["inFlight"] >= 2 and predictions[fqdn("hub-b")]["waitMs"] > 0
        assert served(r) != "hub-b"


def test_a_peer_that_cannot_start_a_forward_in_time_turns_it_back_and_the_walk_moves_on(three_stale):
    """hub-b holds a fleet's 6,000-token head; then its own app fills both its slots, which hub-a
    cannot see. hub-a predicts hub-b free and 3 s sooner than anywhere else and forwards the next
    session there, allowing that much wait; hub-b's slot clock says 20 s, so it answers 429 busy
    at once, and the request is served by the next candidate. The app sees one 200."""
    nodes, sims = three_stale
    a, b = nodes["hub-a"], nodes["hub-b"]
    b_id = a.node.peers.by_fqdn(fqdn("hub-b")).id
    head = text("the agent's system prompt and tools", 6000)
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer", "targetPeerId": b_id})
    assert served(chat(a, [{"role": "system", "content": head}, {"role": "user", "content": text("one", 400)}])) \
        == "hub-b"
    op(a, "DELETE", "/pins?scope=default")
    # 1,000 tokens at 20 ms a token: each holds its slot 20 s on the engines' clock (2 s real)
    with own_app_fills(b, sims["hub-b"], 1000, "long"):
        assert a.node.load.peer_load(b_id, 0) == 0  # as far as hub-a knows, hub-b is idle
        chats_on_b = sims["hub-b"].stats()["by_path"]["/v1/chat/completions"]
        r = chat(a, [{"role": "system", "content": head}, {"role": "user", "content": text("two", 400)}])
        entry = row(a, r)
        predicted = {p["node"]: p for p in entry["ttft"]["predictions"]}
        assert predicted[fqdn("hub-b")]["waitMs"] == 0 and predicted[fqdn("hub-b")]["cachedTokens"] >= 5_800
        assert served(r) != "hub-b" and entry["failedOverFrom"] == [fqdn("hub-b")]
        refusal = entry["attempts"][0]
        assert refusal["status"] == 429 and refusal["reason"].startswith("busy"), refusal
        assert sims["hub-b"].stats()["by_path"]["/v1/chat/completions"] == chats_on_b  # never reached the engine
        inbound = next(e for e in op(b, "GET", "/routing-log?limit=50")["entries"] if e["id"] == entry["id"])
        assert inbound["status"] == 429 and inbound["reason"].startswith("busy"), inbound
        assert a.node.load.peer_load(b_id, 0) >= 2  # the refusal carried hub-b's count
        # the next session of the fleet is placed knowing hub-b is full: its wait is priced, and
        # the head it shares is still counted there (another prompt shares it)
        r = chat(a, [{"role": "system", "content": head}, {"role": "user", "content": text("three", 400)}])
        predicted = {p["node"]: p for p in row(a, r)["ttft"]["predictions"]}
        assert predicted[fqdn("hub-b")]["waitMs"] > 0 and served(r) != "hub-b", predicted


def test_a_new_session_goes_by_sessions_held_per_slot_not_to_the_smallest_box(unequal_slots):
    """hub-a has sent two sessions to each 4-slot engine and one to hub-c's single slot. Counted
    whole, hub-c held the fewest and took the next session, evicting the one it held; per slot
    it is the fullest, and the tie goes to a half-empty engine (the entry node's own first)."""
    nodes, sims = unequal_slots
    a = nodes["hub-a"]
    targets = [("peer", "hub-b"), ("peer", "hub-b"), ("peer", "hub-c"), ("local", "hub-a")]
    for i, (kind, name) in enumerate(targets):
        pin = {"scope": "default", "targetKind": kind}
        if kind == "peer":
            pin["targetPeerId"] = a.node.peers.by_fqdn(fqdn(name)).id
        op(a, "POST", "/pins", pin)
        r = chat(a, [{"role": "system", "content": text(f"placed {i}", 1500)}, {"role": "user", "content": "go"}])
        assert served(r) == name
    op(a, "DELETE", "/pins?scope=default")
    r = chat(a, [{"role": "system", "content": text("the next session", 1500)}, {"role": "user", "content": "go"}])
    section = row(a, r)["ttft"]
    spread = dict(zip(section["spread"]["tied"], section["spread"]["sessions"], strict=True))
    assert spread == {"local": 2, fqdn("hub-b"): 2, fqdn("hub-c"): 1}  # what hub-a sent each
    assert section["spread"]["tied"][-1] == fqdn("hub-c")  # one of one slot: the fullest
    assert served(r) == "hub-a"
    assert sims["hub-c"].stats()["by_path"].get("/v1/chat/completions") == 2  # its warm-up, the pinned one


def test_a_short_prompt_a_peer_holds_stays_local_when_the_hop_costs_more_than_reading_it(distant_peers):
    """hub-b holds a short session's prompt; hub-a's own idle engine reads it in milliseconds, and
    the hop to hub-b (timed on the polls) costs more than that: the request stays local, where a
    prediction without the hop sent it to the peer holding the cache."""
    nodes, _ = distant_peers
    a = nodes["hub-a"]
    b_id = a.node.peers.by_fqdn(fqdn("hub-b")).id
    assert a.node.hops.wall_ms(b_id) is not None  # the polls timed it
    messages = [{"role": "user", "content": "hello there"}]
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer", "targetPeerId": b_id})
    assert served(chat(a, messages)) == "hub-b"
    op(a, "DELETE", "/pins?scope=default")
    r = chat(a, messages)
    predictions = {p["node"]: p for p in row(a, r)["ttft"]["predictions"]}
    held, own = predictions[fqdn("hub-b")], predictions["local"]
    assert held["cachedTokens"] > 0 and held["prefillMs"] == 0  # hub-b holds the whole prompt
    assert own["hopMs"] == 0 and held["hopMs"] > own["prefillMs"] and held["predictedMs"] >= held["hopMs"]
    assert served(r) == "hub-a"


def test_a_full_engine_is_priced_by_what_its_work_has_left_not_by_its_count(one_slot_each):
    """Every engine is full with one request of its own node's app: hub-a's and hub-c's asked for
    600 tokens (a minute on the engines' clock), hub-b's for 200. Counted, the three tie and the
    entry node keeps the next request; by what each has left, hub-b frees forty seconds sooner,
    and hub-a learns it from hub-b's stated schedule (the busy load poll), aged."""
    nodes, sims = one_slot_each
    a, b, c = (nodes[n] for n in NAMES)
    for n in (a, b, c):
        op(n, "POST", "/pins", {"scope": "default", "targetKind": "local"})  # each app's work stays home
    held = [threading.Thread(target=chat, args=(n, [{"role": "user", "content": text(f"long {i}", 100)}]),
                             kwargs={"max_tokens": tokens})
            for i, (n, tokens) in enumerate(((a, 600), (b, 200), (c, 600)))]
    for t in held:
        t.start()
    try:
        assert wait_until(lambda: all(sims[n].stats()["in_flight"] == 1 for n in NAMES), timeout=20)
        b_id, c_id = (a.node.peers.by_fqdn(fqdn(n)).id for n in ("hub-b", "hub-c"))
        assert wait_until(lambda: all(a.node.peer_slots.stated(p, "llamacpp") is not None
                                      and a.node.peer_slots.stated(p, "llamacpp")[0][0] > 5_000
                                      for p in (b_id, c_id)), timeout=10)
        op(a, "DELETE", "/pins?scope=default")
        r = chat(a, [{"role": "system", "content": text("new session", 1500)}, {"role": "user", "content": "go"}])
        predictions = {p["node"]: p for p in row(a, r)["ttft"]["predictions"]}
        waits = {k: (p["waitMs"], p["waitBasis"], p["inFlight"]) for k, p in predictions.items()}
        assert all(p["waitBasis"] == "schedule" for p in predictions.values()), waits
        # hub-b's 200 tokens end 40 s (engine clock) before the others' 600
        assert predictions[fqdn("hub-b")]["waitMs"] + 25_000 < min(predictions["local"]["waitMs"],
                                                                    predictions[fqdn("hub-c")]["waitMs"]), waits
        assert served(r) == "hub-b", waits
    finally:
        for t in held:
            t.join()
