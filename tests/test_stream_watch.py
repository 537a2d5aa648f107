"""A committed stream that stalls or loops is ended (issue 28 items 2 and 3), through two
running nodes, for OpenAI chat, Ollama native, Anthropic Messages and Responses streams
(natively and translated): within poolStreamStallMs plus a second of its last content, with
the dialect's error event, recorded and struck as an output fault."""

from __future__ import annotations

import time
from contextlib import ExitStack

import httpx
import pytest
from streams import CASE_IDS, CASES, error_of, forgive, request, row, settings, sim_for, start_pool, text_of

STALL_MS = 1000


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with ExitStack() as stack:
        nodes, sims = start_pool(stack, tmp_path_factory.mktemp("watch"))
        settings(nodes["hub-a"], poolStreamStallMs=STALL_MS)
        yield nodes, sims


@pytest.fixture(autouse=True)
def clean(pool):
    nodes, sims = pool
    for sim in sims.values():
        sim.reset()
    forgive(nodes)


def _timed(node, dialect, model, **kw) -> tuple[httpx.Response, bytes, list[tuple[float, bytes]]]:
    """The response, its body, and each chunk with when it arrived."""
    route, body = request(dialect, model, **kw)
    chunks = []
    with httpx.stream("POST", node.url + route, json=body, timeout=30) as response:
        for chunk in response.iter_raw():
            chunks.append((time.monotonic(), chunk))
    return response, b"".join(c for _t, c in chunks), chunks


@pytest.mark.parametrize("where", ["local", "hop"])
@pytest.mark.parametrize("dialect,model", CASES, ids=CASE_IDS)
def test_a_stall_mid_stream_ends_within_the_setting_plus_a_second(pool, dialect, model, where):
    nodes, sims = pool
    # "hop": hub-a's engine is passed over at once (503), so hub-b's engine stalls behind a peer
    if where == "hop":
        sim_for(sims, "a", model).add_fault("error:503", count=1)
    sim_for(sims, "b" if where == "hop" else "a", model).add_fault("stall", count=1)
    response, raw, chunks = _timed(nodes["hub-a"], dialect, model)
    assert response.status_code == 200
    assert text_of(dialect, raw) == "tok0 tok1 tok2 tok3 tok4 tok5"  # the first half, then nothing
    message = error_of(dialect, raw)
    assert message is not None and "no content for" in message
    # the last content chunk, then the error event: the stall's length plus at most a second
    content_at = [t for t, c in chunks if text_of(dialect, c) or b"tok" in c]
    waited = chunks[-1][0] - content_at[-1]
    assert STALL_MS / 1000 * 0.9 <= waited <= STALL_MS / 1000 + 1.0, waited
    logged = row(nodes["hub-a"], response.headers["x-hub-pool-request-id"])
    assert logged["outcome"] == "failed" and logged["reason"].startswith("stalled (no content for")
    assert logged["requestError"] == {"signature": "stalled", "basis": "node", "confirms": None}
    stalled = sim_for(sims, "b" if where == "hop" else "a", model)
    assert stalled.stats()["aborted"] == 1  # the engine was let go


@pytest.mark.parametrize("dialect,model", CASES, ids=CASE_IDS)
def test_a_loop_is_cut(pool, dialect, model):
    nodes, sims = pool
    sim_for(sims, "a", model).add_fault("loop", count=1)
    response, raw, _chunks = _timed(nodes["hub-a"], dialect, model, tokens=3000)
    assert response.status_code == 200
    text = text_of(dialect, raw)
    assert text.startswith("Let me think about this. The answer is the same as the answer.")
    assert 600 <= len(text) < 3000  # cut well before the 3,000 tokens (~13,000 characters) it asked for
    message = error_of(dialect, raw)
    assert message is not None and "looping" in message
    logged = row(nodes["hub-a"], response.headers["x-hub-pool-request-id"])
    assert logged["outcome"] == "failed" and logged["reason"].startswith("degenerate-loop (a ")
    assert logged["requestError"]["signature"] == "degenerate-loop"


def test_an_answer_that_only_pauses_is_whole(pool):
    """Tokens 0.6 s apart under a 1 s stall: never cut."""
    nodes, sims = pool
    sim = sim_for(sims, "a", "m:8b")
    sim.configure(decode_ms_per_token=600)
    try:
        response, raw, _chunks = _timed(nodes["hub-a"], "openai", "m:8b", tokens=4)
    finally:
        sim.configure(decode_ms_per_token=5)
    assert text_of("openai", raw) == "tok0 tok1 tok2 tok3" and error_of("openai", raw) is None
    assert row(nodes["hub-a"], response.headers["x-hub-pool-request-id"])["outcome"] == "served"


def test_the_watch_off_leaves_the_stall_to_the_app(pool):
    nodes, sims = pool
    settings(nodes["hub-a"], poolStreamStallMs=0)
    try:
        sim_for(sims, "a", "m:8b").add_fault("stall", count=1)
        route, body = request("openai", "m:8b")
        with httpx.stream("POST", nodes["hub-a"].url + route, json=body, timeout=httpx.Timeout(10, read=2.5)) as r:
            with pytest.raises(httpx.ReadTimeout):
                r.read()
    finally:
        settings(nodes["hub-a"], poolStreamStallMs=STALL_MS)
