"""F13: the mesh, bounded: `hubpool bench mesh` at four nodes (the twenty-node run is the
benchmark's, its figures in docs/performance.md; four keeps this under a minute or two on a
loaded two-core box) with a 2 s health poll instead of the default 30 s.

Every phase of the benchmark runs for real — N `hubpool serve` processes with simulated
engines, the six pairings through the operator API with a PIN, the idle window, placement at
N candidates against 2, a mixed load entering every node reconciled with every routing log,
a node SIGKILLed and restarted — and the test holds the run to what the issue asks: the whole
history reconciles (no problem reported), every node reads the dead node unreachable within
the three failed polls the spec allows (plus one poll of phase and a loaded box's slack), and
connected again once it is back.
"""

from __future__ import annotations

import pytest

from hubpool_core.bench.mesh import UNREACHABLE_POLLS, run_mesh, text_lines

pytestmark = [pytest.mark.fault, pytest.mark.timeout(400)]

NODES = 4
POLL_S = 2


def test_f13_mesh_of_four_pairs_reconciles_and_detects_a_death(tmp_path, report):
    result = run_mesh(nodes=NODES, poll_s=POLL_S, idle_s=6, placement_requests=10, per_node=8, workdir=tmp_path)
    f = result.figures
    print("\n".join(text_lines(result)))
    assert result.problems == [], result.problems
    assert f["pairings"] == NODES * (NODES - 1) // 2
    assert f["mixedRequests"] == NODES * 8 and f["mixedOk"] == f["mixedRequests"], f
    assert f["mixedForwarded"] > 0, "the mixed load crossed the mesh"
    # every node was measured (a process that was not found reads zero)
    assert all(v > 0 for v in f["idleCpuPct"].values()), f["idleCpuPct"]
    assert f["rssMbPerNode"]["max"] > 0
    assert set(f["servedBy"]) == {"llama3.2:3b", "duo-mesh:1b"}
    # three failed polls make a peer unreachable: one more poll of phase, and 10 s of a loaded box
    assert f["deathToAllUnreachableS"] <= (UNREACHABLE_POLLS + 1) * POLL_S + 10, f
    assert f["restartToAllConnectedS"] <= f["restartBootS"] + 2 * POLL_S + 20, f
    report("F13-mesh", {k: f[k] for k in ("pairCallsS", "meshConnectedS", "idleCpuPctPerNode", "rssMbPerNode",
                                          "cpuMsPerRequest", "mixedRequests", "reconciledRows",
                                          "deathToAllUnreachableS", "restartToAllConnectedS")} | {"nodes": NODES,
                                                                                                   "pollS": POLL_S})
