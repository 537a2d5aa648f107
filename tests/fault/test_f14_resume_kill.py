"""F14: resume after a SIGKILL (issue 28 item 4's must-show), through whole processes.

hub-a and hub-b are `hubpool serve` processes, each beside its own simulated Ollama (0.14, so
it serves OpenAI chat, Ollama's native chat, Anthropic Messages and Responses itself) as a
separate `hubpool-sim` process answering the deterministic "prose" text. hub-a has
poolStreamResume 1. The app streams from hub-a; once it has read part of the answer, the
process serving it is SIGKILLed:

- ``engine``: hub-a's own engine (hub-a pinned to itself), continued by hub-b;
- ``peer``: hub-b's node process, which was relaying its engine's answer to hub-a (hub-a
  pinned to hub-b), continued by hub-a's engine.

The kernel closes a killed process's sockets, so the relay reads a broken stream at once (no
timeout is involved, which keeps the test deterministic and bounded). Pass: the app's text
equals the uninterrupted answer byte for byte, as one stream (one role chunk, message_start
or response.created; one id; content-block index 0 throughout; sequence numbers 0…n; usage
summed to the whole answer's tokens), and hub-a's row says it was resumed from the killed
node. Each dialect has its own model, so no engine is struck twice for one model (two
strikes would withhold it and reorder the walk).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from harness import fqdn
from process_harness import NodeProcess, SimProcess, make_process_pool, pair, wait_connected
from rig import RIG_ENV, metric
from stream_shapes import one_stream
from streams import QUESTION, error_of, events, request, text_of

from hubpool_sim.text import prose_token

pytestmark = [pytest.mark.fault, pytest.mark.timeout(900)]

TOKENS = 40
#: the answer is cut once the app has read this many of its words
KILL_AFTER_WORDS = 8
#: the killed engine's pace: 40 tokens take 6 s, so the kill lands well inside the answer
SLOW_MS, FAST_MS = 150, 5
DIALECTS = ("openai", "native", "messages", "responses")
MODELS = {dialect: f"{dialect}-model:1b" for dialect in DIALECTS}
P = "/api/inference/pool"


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("f14")
    sim_config = root / "ollama.json"
    sim_config.write_text(json.dumps({
        "flavor": "ollama", "version": "0.14.0", "text": "prose", "tokens": TOKENS, "slots": 8,
        "decode_ms_per_token": FAST_MS, "prompt_cache": False,
        "models": list(MODELS.values()), "preloaded": list(MODELS.values())}))
    sims = {name: SimProcess(f"{name}-engine", root, ["--config", str(sim_config)]) for name in ("hub-a", "hub-b")}
    nodes = make_process_pool(root, ["hub-a", "hub-b"], environ=RIG_ENV,
                              per_node={n: {"OLLAMA_URL": sims[n].url} for n in sims},
                              settings={"poolStreamResume": 1}, warm=("hub-b",))
    try:
        for sim in sims.values():
            sim.start()
        for node in nodes.values():
            node.start(ready_timeout=60)
        pair(nodes, "hub-a", "hub-b")
        _connected(nodes)
        yield nodes, sims
    finally:
        for node in nodes.values():
            node.stop(grace=3)
        for sim in sims.values():
            sim.kill()


def _connected(nodes: dict[str, NodeProcess]) -> None:
    for model in MODELS.values():
        wait_connected(nodes, timeout=90, model=model)


def _pin(a: NodeProcess, victim: str) -> None:
    target = {"targetKind": "local"} if victim == "engine" else {"targetKind": "peer", "targetPeerId": a.peer_id("hub-b")}
    a.op("POST", "/pins", {"scope": "default", **target})


def _body(dialect: str) -> tuple[str, dict]:
    route, body = request(dialect, MODELS[dialect], tokens=TOKENS)
    if dialect == "openai":
        body["stream_options"] = {"include_usage": True}
    return route, body


def _complete(dialect: str, raw: bytes) -> bytes:
    """The frames of a stream read so far that are whole (a read can end inside one)."""
    sep = b"\n" if dialect == "native" else b"\n\n"
    return raw[: raw.rfind(sep) + len(sep)] if sep in raw else b""


def _row(node: NodeProcess, rid: str, timeout: float = 30.0) -> dict:
    """hub-a's row for ``rid`` once it is settled (a stream settles after its last byte)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in node.op("GET", "/routing-log?limit=500")["entries"] if r["id"] == rid]
        if found and found[0]["outcome"] != "pending":
            return found[0]
        assert time.monotonic() < deadline, f"row {rid} still pending or missing: {found}"
        time.sleep(0.1)


@pytest.mark.parametrize("victim", ["engine", "peer"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_f14_a_stream_whose_server_is_sigkilled_is_resumed_byte_for_byte(pool, dialect, victim, report):
    nodes, sims = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    _pin(a, victim)
    route, body = _body(dialect)

    # the uninterrupted answer, through the same walk
    with httpx.Client(base_url=a.url, timeout=60, trust_env=False) as c:
        reference = c.post(route, json=body)
    assert reference.status_code == 200
    whole = text_of(dialect, reference.content)
    assert whole == "".join(prose_token(QUESTION.encode(), i) for i in range(TOKENS))

    serving = sims["hub-a"] if victim == "engine" else sims["hub-b"]
    serving.control("POST", "/_sim/config", {"decode_ms_per_token": SLOW_MS})
    raw = b""
    killed_at_words = None
    try:
        with httpx.stream("POST", a.url + route, json=body, timeout=httpx.Timeout(60), trust_env=False) as r:
            assert r.status_code == 200
            rid = r.headers["x-hub-pool-request-id"]
            for chunk in r.iter_raw():
                raw += chunk
                if killed_at_words is None:
                    words = len(text_of(dialect, _complete(dialect, raw)).split())
                    if words >= KILL_AFTER_WORDS:
                        killed_at_words = words
                        (sims["hub-a"] if victim == "engine" else b).kill()
    finally:
        # the world back as it was: the killed process started again (same port, same data)
        if victim == "engine":
            if not sims["hub-a"].alive():
                sims["hub-a"].start()
        else:
            sims["hub-b"].control("POST", "/_sim/config", {"decode_ms_per_token": FAST_MS})
            if not b.alive():
                b.start(ready_timeout=60)
            _connected(nodes)

    assert killed_at_words is not None and killed_at_words < TOKENS, "the answer ended before the kill"
    assert error_of(dialect, raw) is None, raw[-400:]
    assert text_of(dialect, raw) == whole
    one_stream(dialect, raw, whole, TOKENS)
    if dialect == "responses":  # the simulator ends an answer cut by its budget as Responses does
        assert events(raw)[-1][1]["type"] == "response.incomplete"

    logged = _row(a, rid)
    killed, continued = ("local", fqdn("hub-b")) if victim == "engine" else (fqdn("hub-b"), "local")
    assert logged["outcome"] == "served" and logged["node"] == continued, logged
    [cut] = logged["resumedFrom"]
    assert cut["node"] == killed and cut["backend"] == "ollama"
    assert cut["reason"].startswith("truncated-upstream ("), cut
    # the cut came after what the app had read when the kill was sent, and before the end
    read_chars = len(" ".join(whole.split(" ")[:killed_at_words]))
    assert read_chars <= cut["atChars"] < len(whole), (cut, read_chars)
    assert metric(_metrics(a), "hubpool_stream_resumes_total", reason="truncated-upstream") >= 1
    report(f"F14 {dialect} {victim}", {"killedAfterWords": killed_at_words, "cutAtChars": cut["atChars"],
                                       "answerChars": len(whole), "reason": cut["reason"]})


def _metrics(node: NodeProcess) -> str:
    with httpx.Client(timeout=10, trust_env=False) as c:
        return c.get(node.url + "/metrics").text
