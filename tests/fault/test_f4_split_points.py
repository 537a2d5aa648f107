"""F4 (parsing half): the relay's stream parsers see the same events for every split point of a
recorded stream. The streams are recorded from the engine simulator (NDJSON from /api/chat,
SSE from /v1/chat/completions, a cut stream of each, and an SSE stream with CRLF line ends and
comments); each is fed to the product's parsers — StreamJudge (the output check every relayed
stream passes through) and NativeToOpenAI (the SSE→NDJSON translator) — whole, split at every
byte offset, in 1-byte slices, and in hypothesis-chosen pieces. Every way must give the same
frames, the same final-frame judgement and the same verdict."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.engine import NATIVE, OPENAI, Engine
from hubpool_core.proxy.output_check import StreamJudge
from hubpool_core.proxy.translate import NativeToOpenAI
from hubpool_sim import SimConfig, SimModel, run_in_thread

MODEL = "llama3.2:3b"


def is_final(dialect: str, frame: bytes) -> bool:
    return Engine.is_final_frame(None, dialect, frame)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def recorded() -> dict[str, tuple[str, bytes]]:
    """name -> (dialect, raw body bytes as the engine sent them)."""
    out: dict[str, tuple[str, bytes]] = {}
    cfg = SimConfig(flavor="ollama", models=[SimModel(MODEL)], tokens=12)
    with run_in_thread(cfg) as sim, httpx.Client(timeout=10, trust_env=False) as c:
        msgs = [{"role": "user", "content": "split me"}]
        out["ndjson"] = (NATIVE, c.post(sim.url + "/api/chat", json={"model": MODEL, "messages": msgs}).content)
        out["sse"] = (OPENAI, c.post(sim.url + "/v1/chat/completions",
                                     json={"model": MODEL, "messages": msgs, "stream": True,
                                           "stream_options": {"include_usage": True}}).content)
        c.post(sim.url + "/_sim/faults", json={"fault": "cut", "count": 2})
        out["ndjson-cut"] = (NATIVE, c.post(sim.url + "/api/chat", json={"model": MODEL, "messages": msgs}).content)
        out["sse-cut"] = (OPENAI, c.post(sim.url + "/v1/chat/completions",
                                         json={"model": MODEL, "messages": msgs, "stream": True}).content)
    # the same SSE with CRLF line ends and a comment line, which SSE allows and engines send
    out["sse-crlf"] = (OPENAI, b": keep-alive\r\n\r\n" + out["sse"][1].replace(b"\n", b"\r\n"))
    for name, (_, body) in out.items():
        assert body.count(b"\n") >= 5, (name, body[:200])
    return out


def judge(dialect: str, pieces: list[bytes]) -> dict:
    j = StreamJudge(dialect, is_final)
    frames = []
    original_look = j._look

    def look(frame: bytes) -> None:
        frames.append(frame)
        original_look(frame)

    j._look = look  # every frame the judge parses, in order
    for p in pieces:
        j.feed(p)
    verdict = j.verdict()
    return {"verdict": verdict, "head": j.head, "final": j.final_seen, "recognised": j.recognised,
            "error": j.error_frame, "last": j.last_object, "frames": frames}


_DURATION = re.compile(rb'"(total_duration|load_duration|prompt_eval_duration|eval_duration)": ?\d+')


def translate(pieces: list[bytes]) -> list[dict]:
    t = NativeToOpenAI("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, True)
    out = b"".join(line for p in pieces for line in t.feed(p))
    events = [json.loads(_DURATION.sub(rb'"\1": 0', line)) for line in out.splitlines() if line.strip()]
    for e in events:  # the translator's own clock, not an event
        e.pop("created_at", None)
    return events


def splits(body: bytes):
    for i in range(len(body) + 1):
        yield [body[:i], body[i:]]


@pytest.mark.parametrize("name", ["ndjson", "sse", "ndjson-cut", "sse-cut", "sse-crlf"])
def test_f4_every_split_point_gives_the_same_events(recorded, name):
    dialect, body = recorded[name]
    whole = judge(dialect, [body])
    assert whole["recognised"] and whole["frames"], whole
    assert (whole["verdict"] is None) == (not name.endswith("-cut")), (name, whole["verdict"])
    count = 0
    for pieces in splits(body):
        assert judge(dialect, pieces) == whole, (name, len(pieces[0]))
        count += 1
    assert judge(dialect, [body[i:i + 1] for i in range(len(body))]) == whole, "1-byte slices"
    assert count == len(body) + 1
    if dialect == OPENAI:
        events = translate([body])
        assert events and (events[-1].get("done") is True) == (not name.endswith("-cut")), events[-1]
        for pieces in splits(body):
            assert translate(pieces) == events, (name, len(pieces[0]))
        assert translate([body[i:i + 1] for i in range(len(body))]) == events


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_f4_any_pieces_give_the_same_events(recorded, data):
    name = data.draw(st.sampled_from(sorted(recorded)))
    dialect, body = recorded[name]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=12)))
    bounds = [0, *cuts, len(body)]
    pieces = [body[a:b] for a, b in zip(bounds, bounds[1:])]
    assert judge(dialect, pieces) == judge(dialect, [body])
    if dialect == OPENAI:
        assert translate(pieces) == translate([body])
