"""The web sign-in limiter is per source, and bounded (issue 26 item 5).

``POST /ui/signin`` answers anyone. It used to count wrong keys in one counter for everyone, so
ten wrong keys a minute from anywhere locked the operator out of the web UI: the operator at
another address got 429. Now the count is per source, as the PIN cooldown's is (spec "What a
source means"): the caller's IP where the node can honestly tell it, one shared count for the
callers behind a proxy it does not trust, and at most 1,024 sources tracked at once.

Sources here are real: the node listens on 127.0.0.1 and a client may bind any 127/8 address,
so 127.0.0.2 is another machine as far as the node can tell. A trusted proxy's callers are told
apart by the X-Forwarded-For hop the proxy appended (HUB_TRUST_PROXY).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
from harness import RunningNode

from hubpool_core.access import sessions
from hubpool_core.access.sessions import MAX_SOURCES, store_for


def _client(node: RunningNode, local_address: str = "127.0.0.1") -> httpx.Client:
    return httpx.Client(base_url=node.url, timeout=30, trust_env=False, follow_redirects=False,
                        transport=httpx.HTTPTransport(local_address=local_address))


def _sign_in(c: httpx.Client, key: str, **headers: str) -> int:
    return c.post("/ui/signin", data={"key": key}, headers=headers).status_code


@pytest.fixture
def node(tmp_path):
    with RunningNode(tmp_path / "n") as n:
        yield n


def test_the_operator_at_another_address_signs_in_while_one_source_is_limited(node):
    with _client(node, "127.0.0.2") as stranger, _client(node) as operator:
        wrong = [_sign_in(stranger, f"hpo_guess-{i}") for i in range(10)]
        assert wrong == [401] * 10
        held = stranger.post("/ui/signin", data={"key": node.operator_key})
        assert held.status_code == 429 and held.headers["retry-after"] == "60" and "set-cookie" not in held.headers
        r = operator.post("/ui/signin", data={"key": node.operator_key})
        assert r.status_code == 303 and r.headers["location"] == "/ui" and "set-cookie" in r.headers
        assert "Too many wrong keys from this address" in held.text
        assert _sign_in(stranger, node.operator_key) == 429  # still held: the operator's sign-in freed nothing
    print("\nsign-in-sources: " + json.dumps({"wrongKeysFromOneSource": 10, "thatSource": 429,
                                             "operatorElsewhere": r.status_code}))


def test_callers_behind_an_untrusted_proxy_share_one_count(node):
    """A proxy's provenance without HUB_TRUST_PROXY: the node cannot tell those callers apart,
    so they share one count; a caller it can tell (no provenance) keeps its own."""
    with _client(node) as c:
        assert [_sign_in(c, "hpo_guess", **{"cf-ray": f"ray-{i}"}) for i in range(10)] == [401] * 10
        assert _sign_in(c, node.operator_key, **{"cf-ray": "another-caller"}) == 429
        assert _sign_in(c, node.operator_key, **{"x-forwarded-for": "198.51.100.7"}) == 429
        assert _sign_in(c, node.operator_key) == 303  # the same socket address, but no proxy in between


def test_with_a_trusted_proxy_each_forwarded_caller_counts_alone(tmp_path):
    with RunningNode(tmp_path / "n", {"HUB_TRUST_PROXY": "1"}) as node, _client(node) as c:
        guesses = [_sign_in(c, "hpo_guess", **{"x-forwarded-for": "203.0.113.5"}) for _ in range(10)]
        assert guesses == [401] * 10
        assert _sign_in(c, node.operator_key, **{"x-forwarded-for": "203.0.113.5"}) == 429
        assert _sign_in(c, node.operator_key, **{"x-forwarded-for": "10.0.0.9, 203.0.113.6"}) == 303


def test_the_limiter_tracks_a_bounded_number_of_sources(tmp_path, monkeypatch):
    """More sources than it tracks, each with a wrong key: the table stays at its bound; a
    source held back stays held back however many others come after it; a new source still
    signs in. The sessions' clock stands still, so the minute cannot pass on a slow machine."""
    frozen = time.time()
    monkeypatch.setattr(sessions, "time", SimpleNamespace(time=lambda: frozen))
    with RunningNode(tmp_path / "n", {"HUB_TRUST_PROXY": "1"}) as node, _client(node) as c:
        held = {"x-forwarded-for": "198.51.100.1"}
        assert [_sign_in(c, "hpo_guess", **held) for _ in range(10)] == [401] * 10
        flood = MAX_SOURCES + 100

        def guesses(first: int) -> set[int]:
            with _client(node) as own:  # a connection per worker: their round trips overlap
                return {_sign_in(own, "hpo_guess", **{"x-forwarded-for": f"10.{i // 256 % 256}.{i % 256}.1"})
                        for i in range(first, flood, 16)}

        with ThreadPoolExecutor(16) as pool:
            assert set().union(*pool.map(guesses, range(16))) == {401}
        tracked = len(store_for(node.node.keys).sign_ins)
        assert tracked <= MAX_SOURCES
        assert _sign_in(c, node.operator_key, **held) == 429
        assert _sign_in(c, node.operator_key, **{"x-forwarded-for": "192.0.2.44"}) == 303
    print("\nsign-in-bound: " + json.dumps({"sourcesSeen": flood + 1, "tracked": tracked, "bound": MAX_SOURCES}))
