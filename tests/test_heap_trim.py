"""The node gives freed heap back after it served something, and leaves an idle heap alone
(hubpool_core/node/heap_trim.py; performance goal G7 in docs/performance.md)."""

from __future__ import annotations

import asyncio
import time

from harness import RunningNode, wait_until

from hubpool_core.node import heap_trim


def test_a_running_node_trims_after_requests_and_not_while_idle(tmp_path, ollama_sim, monkeypatch):
    monkeypatch.setattr(heap_trim, "TRIM_INTERVAL_S", 0.05)
    with RunningNode(tmp_path / "n", {"OLLAMA_URL": ollama_sim.url}) as n:
        heap = n.node.heap
        assert heap.available, "glibc's malloc_trim should be found on this Linux machine"
        with n.client() as c:
            for _ in range(3):
                r = c.post("/v1/chat/completions", json={"model": "llama3.2:3b", "messages": [
                    {"role": "user", "content": "hi"}]})
                assert r.status_code == 200
        served = n.node.routing_log.total_recorded
        assert served == 3
        # trims may land between the requests; wait for the one that saw all three
        assert wait_until(lambda: heap.seen == served), "no trim after requests were served"
        settled = heap.trims
        assert settled >= 1
        time.sleep(0.4)  # eight intervals with nothing served
        assert heap.trims == settled, "an idle node trimmed again"
        with n.client() as c:
            assert c.post("/api/chat", json={"model": "llama3.2:3b", "stream": False, "messages": [
                {"role": "user", "content": "again"}]}).status_code == 200
        assert wait_until(lambda: heap.trims == settled + 1)


def test_without_malloc_trim_the_trimmer_does_nothing(monkeypatch):
    monkeypatch.setattr(heap_trim, "_find_trim", lambda: None)
    trimmer = heap_trim.HeapTrimmer(lambda: 1)
    assert not trimmer.available

    async def life() -> None:
        trimmer.start()  # nothing to run without malloc_trim
        await trimmer.step()
        await trimmer.stop()

    asyncio.run(life())
    assert trimmer.trims == 0


def test_a_trim_is_counted_before_the_activity_it_saw_is(monkeypatch):
    """A reader in another thread (the test above) waits for ``seen`` and then reads ``trims``;
    the trim itself runs with the GIL released, so ``seen`` must not move before it is counted."""
    during: list[tuple[int, int]] = []
    trimmer = heap_trim.HeapTrimmer(lambda: 7)
    monkeypatch.setattr(trimmer, "_trim", lambda _pad: during.append((trimmer.seen, trimmer.trims)) or 1)
    asyncio.run(trimmer.step())
    assert during == [(-1, 0)]  # while trimming: neither moved yet
    assert (trimmer.seen, trimmer.trims) == (7, 1)
