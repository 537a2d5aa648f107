"""The test lanes: what ``-m "not slow"`` (CONTRIBUTING.md, the fast lane) leaves out.

Slow is decided by path, from measured durations on a 2-core machine (the figures beside
each entry, from a full run's JUnit report): the whole-process and browser suites, and every
file whose tests take 5 s or more together. The full suite
(``uv run pytest``, what CI runs) still runs everything.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

# Hypothesis's per-example deadline (200 ms) is a timing assertion: on a 2-core machine running
# nodes in other threads an example can take longer and fail although its property holds
# (test_signing's round trip did). Properties here are about values, never speed, so the
# deadline is off everywhere; a test that wants one sets it itself.
settings.register_profile("hubpool", deadline=None)
settings.load_profile("hubpool")

#: paths (relative to the repository root) whose tests are slow
SLOW = (
    "tests/fault/",  # whole processes under injected faults: 262 s
    "tests/web/",  # a real browser: 60 s
    "tests/real_engine/",  # a real llama-server: 14 s
    "tests/real_clients/",  # the real Claude Code, Codex and OpenCode, and a real llama-server: 190 s
    "plugins/vllm/tests/test_vllm_queue_depth_node.py",  # 6 s
    "sim/tests/test_demo.py",  # 53 s
    "tests/security/test_api_fuzz.py",  # 15 s
    "tests/security/test_agent_bodies_never_500.py",  # 9 s: 60 generated agent bodies through a node
    "tests/security/test_pin_and_recreated_peer.py",  # 11 s
    "tests/security/test_pin_cooldown_bound.py",  # 33 s: 4,296 pairing requests under made-up names
    "tests/security/test_signin_sources.py",  # 10 s: 1,125 sign-in sources
    "tests/security/test_signing_attacks.py",  # 13 s
    "tests/security/test_header_flood.py",  # 11 s: thirty 2 MiB headers among 210 refusals
    "tests/security/test_stranger_memory.py",  # 12 s: a node process sent 2 GiB and 320 MB of headers
    "tests/security/test_upgrade_state_machine.py",  # 17 s
    "tests/test_advice.py",  # 24 s
    "tests/test_affinity_contention.py",  # 9 s
    "tests/test_agent_session.py",  # 17 s
    "tests/test_admission_queue.py",  # 29 s: two nodes, one-slot engines held busy
    "tests/test_bad_input.py",  # 14 s
    "tests/test_bench_capacity.py",  # 42 s
    "tests/test_bench_pool.py",  # 100 s: eight hubpool nodes, nginx and the oracle on two simulated boxes
    "tests/test_chaos.py",  # 66 s
    "tests/test_cli.py",  # 59 s
    "tests/test_cli_api_keys.py",  # 18 s: nodes and a dozen CLI processes
    "tests/test_cli_output_safety.py",  # 12 s: three CLI processes against a node
    "tests/test_wheels_install.py",  # 140 s: builds every wheel, installs them in a fresh venv, serves
    "tests/test_cli_pool.py",  # 150 s
    "tests/test_containers_chain.py",  # 16 s: two nodes, a fake Docker socket and three CLI runs
    "tests/test_clients_agents.py",  # 30 s
    "tests/test_stream_watch.py",  # 36 s: two nodes, streams left to stall
    "tests/test_stream_resume.py",  # 17 s: two nodes, streams stalled and resumed
    "tests/test_stream_unresumable.py",  # 24 s: two nodes, tool calls and routes cut and not resumed
    "tests/test_loop_rule.py",  # 8 s: the loop rule over the Python standard library
    "tests/test_stream_commit.py",  # 75 s: two nodes, each wedged engine waited out to its header budget
    "sim/tests/test_stream_faults.py",  # 10 s
    "tests/test_clients_ollama.py",  # 7 s
    "tests/test_history.py",  # 18 s: nodes with history on, restarted, and the CLI
    "tests/test_hangup_after_headers.py",  # 8 s: engines that stall after their headers, one pair of nodes
    "tests/test_history_crash.py",  # 27 s: a node process SIGKILLed under load and started again
    "tests/test_identity_lifecycle.py",  # 8 s
    "tests/test_placement_mechanisms.py",  # 14-21 s: three nodes, three simulated boxes, each test
    "tests/test_cold_and_burst.py",  # 46 s: three nodes, cold loads waited out and slots held open
    "tests/test_identity_recovery.py",  # 10 s: a real restart and three CLI runs
    "tests/test_pairing.py",  # 36 s
    "tests/test_pair_by_lan_name.py",  # 11 s: pairs by LAN name through the CLI, end to end
    "tests/test_peer_security.py",  # 6 s
    "tests/test_placement_entry.py",  # 10 s
    "tests/test_postgres_outage.py",  # 12 s: its own PostgreSQL cluster, stopped and started twice
    "tests/test_plugins.py",  # 17 s
    "tests/test_probe_isolation.py",  # 12 s: three nodes paired, one peer silent
    "tests/test_routing.py",  # 41 s
    "tests/test_routing_log.py",  # 8 s
    "tests/test_serve.py",  # 14 s
    "tests/test_serve_path.py",  # 12 s
    "tests/test_split_stages.py",  # 18 s
    "tests/test_strict_numbers.py",  # 38 s: nodes started with bad numbers, `hubpool serve` processes
    "tests/test_throughput_e2e.py",  # 19 s
    "tests/test_tracing.py",  # 15 s
    "tests/test_ttft_ranking.py",  # 20 s: two nodes, engines held busy
    "tests/test_upgrade.py",  # 16 s: the previous release's data directory, migrated and served
    "tests/test_verdicts_output.py",  # 9 s
    "tests/test_walk_ends.py",  # 8 s: every agent dialect's 502, a pair of nodes for a stored response
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        try:
            rel = item.path.relative_to(root).as_posix()
        except ValueError:
            continue
        if rel.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
