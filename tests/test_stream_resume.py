"""Resume (issue 28 item 4, poolStreamResume 1), through two running nodes beside simulated
engines answering the deterministic "prose" text: a stream cut mid-answer is continued by the
next candidate and the app's text equals the uninterrupted answer byte for byte, as one stream
(one role chunk / message_start / response.created, the first attempt's ids)."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import pytest
from streams import (
    CASE_IDS,
    CASES,
    error_of,
    events,
    forgive,
    row,
    served_by,
    settings,
    sim_for,
    start_pool,
    stream,
    text_of,
)

from hubpool_core.telemetry.annotations import annotations


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with ExitStack() as stack:
        nodes, sims = start_pool(stack, tmp_path_factory.mktemp("resume"), tokens=40, text="prose")
        settings(nodes["hub-a"], poolStreamStallMs=800, poolStreamResume=1)
        yield nodes, sims


@pytest.fixture(autouse=True)
def clean(pool):
    nodes, sims = pool
    for sim in sims.values():
        sim.reset()
    forgive(nodes)


def _whole(pool, dialect, model):
    nodes, sims = pool
    response = stream(nodes["hub-a"], dialect, model, tokens=40)
    assert response.headers["x-hub-pool-served-by"] == "local"
    return text_of(dialect, response.content)


@pytest.mark.parametrize("dialect,model", CASES, ids=CASE_IDS)
def test_a_stalled_stream_is_resumed_byte_for_byte(pool, dialect, model):
    nodes, sims = pool
    whole = _whole(pool, dialect, model)
    assert len(whole.split()) == 40
    sim_for(sims, "a", model).add_fault("stall", count=1)
    response = stream(nodes["hub-a"], dialect, model, tokens=40)
    assert response.status_code == 200
    assert text_of(dialect, response.content) == whole
    assert error_of(dialect, response.content) is None
    seen = events(response.content) if dialect != "native" else []
    names = [n or (d.get("type") if isinstance(d, dict) else d) for n, d in seen]
    if dialect == "messages":
        assert names.count("message_start") == 1 and names[-1] == "message_stop"
        starts = [d["index"] for n, d in seen if n == "content_block_start"]
        assert starts == [0] and {d["index"] for n, d in seen if n == "content_block_delta"} == {0}
        assert [d for n, d in seen if n == "message_delta"][0]["usage"]["output_tokens"] == 40
    elif dialect == "responses":
        assert names.count("response.created") == 1 and names[-1] == "response.incomplete"
        seqs = [d["sequence_number"] for _n, d in seen]
        assert seqs == list(range(len(seqs)))
        final = seen[-1][1]["response"]
        assert final["id"] == seen[0][1]["response"]["id"]
        assert final["output"][0]["content"][0]["text"] == whole
    elif dialect == "openai":
        chunks = [d for _n, d in seen if isinstance(d, dict)]
        assert len({c["id"] for c in chunks}) == 1
        assert sum("role" in c["choices"][0]["delta"] for c in chunks if c["choices"]) == 1
    logged = row(nodes["hub-a"], response.headers["x-hub-pool-request-id"])
    assert logged["outcome"] == "served" and logged["node"] == served_by("hub-b")
    [cut] = logged["resumedFrom"]
    assert cut["node"] == "local" and cut["reason"].startswith("stalled (no content for")
    assert cut["atChars"] == len(" ".join(whole.split(" ")[:20]))


def test_resumes_are_counted_and_marked(pool):
    nodes, sims = pool
    sim_for(sims, "a", "m:8b").add_fault("stall", count=1)
    response = stream(nodes["hub-a"], "openai", "m:8b", tokens=40)
    logged = row(nodes["hub-a"], response.headers["x-hub-pool-request-id"])
    notes = annotations(logged)
    assert any(n.startswith("resumed: local's llamacpp was cut at ") for n in notes), notes
    scraped = httpx.get(nodes["hub-a"].url + "/metrics", timeout=30, trust_env=False).text
    count = next(line for line in scraped.splitlines() if line.startswith('hubpool_stream_resumes_total{reason="stalled"}'))
    assert float(count.split()[-1]) >= 1
