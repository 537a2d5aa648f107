"""The PIN cooldown tracks a bounded number of keys (issue 26, found beside items 1 and 5).

``POST /pair/request`` answers anyone, and a wrong PIN strikes the cooldown under the name the
caller claims (and its address, when the node can tell it). A claimed name is the caller's to
choose, so a caller the node cannot tell apart (behind a proxy it does not trust) could make it
hold one entry per name it invented, for five minutes each: nothing bounded the table. It now
holds at most MAX_COOLDOWN_KEYS; the per-PIN ceiling of five wrong guesses is, as the spec says,
what bounds a PIN's exposure.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
from harness import make_pool

from hubpool_core.peering.pairing_pin import MAX_COOLDOWN_KEYS

P = "/api/inference/pool"


def test_a_stranger_inventing_names_cannot_grow_the_cooldown_past_its_bound(tmp_path):
    node = make_pool(tmp_path, ["hub-a"])["hub-a"].start()
    try:
        with node.client(headers=node.headers()) as c:
            assert c.post(P + "/pairing-pin").status_code == 200
        sent = MAX_COOLDOWN_KEYS + 200

        def guesses(first: int) -> set[int]:
            with httpx.Client(base_url=node.url, timeout=30, trust_env=False) as own:
                return {own.post(P + "/pair/request", headers={"cf-ray": f"ray-{i}"}, json={
                    "fromNodeFqdn": f"made-up-{i}.example-tailnet.ts.net", "token": "t" * 64, "pin": "000000",
                }).status_code for i in range(first, sent, 16)}

        with ThreadPoolExecutor(16) as pool:
            answers = set().union(*pool.map(guesses, range(16)))
        held = len(node.node.pin_cooldown)
        print("\npin-cooldown-bound: " + json.dumps({"namesClaimed": sent, "keysHeld": held,
                                                    "bound": MAX_COOLDOWN_KEYS}))
        assert answers <= {401, 429}, answers
        assert held <= MAX_COOLDOWN_KEYS
        # the real bound on the PIN held: five wrong guesses destroyed it
        assert node.node.pairing_pin.status(0)["active"] is False
    finally:
        node.stop()
