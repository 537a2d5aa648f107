"""G1 and G2 for ``/v1/messages`` in `hubpool bench relay`: what a hop adds to Anthropic's
Messages route, non-streamed (total time) and streamed (time to first byte), native and
translated, measured in the same interleaved rounds as the rest of the run: once with a short
prompt, and once with a real Claude Code turn (the captured request in
tests/real_clients/data/claude-code.json: ~48 KB of system blocks, a system message inside
``messages``, twelve tools, ``anthropic-beta`` and the rest, sent as Claude Code sends it).

Native: a second stub engine whose ``/api/version`` names a release that serves Messages,
behind its own node, against that stub's own ``/v1/messages``. Translated: the run's
one-hop node, whose stub names no such release, so the node translates to chat
completions; it is measured against the stub's ``/v1/chat/completions`` of the same prompt,
the engine work the translated request really costs. Separate from relay.py so the figures
other issues add to the bench stay apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hubpool_core.bench import procs
from hubpool_core.bench.stub_engine import FAST

MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
#: the first Ollama release that serves /v1/messages, as the native stub reports it
NATIVE_VERSION = "0.14.0-bench"
NATIVE_NODE = "bench-m"
#: (scenario, streamed, requests, body): "short" is the bench's own prompt, "claude-code" the captured turn
SCENARIOS = {"quick": (("messages-nonstream-c1", False, 300, "short"), ("messages-stream-c1", True, 200, "short"),
                       ("messages-claude-code-nonstream-c1", False, 200, "claude-code"),
                       ("messages-claude-code-stream-c1", True, 150, "claude-code")),
             "full": (("messages-nonstream-c1", False, 1000, "short"), ("messages-stream-c1", True, 500, "short"),
                      ("messages-claude-code-nonstream-c1", False, 600, "claude-code"),
                      ("messages-claude-code-stream-c1", True, 400, "claude-code"))}
#: target name -> the path it is sent (one body fits both: model, messages, stream, max_tokens)
ARMS = {"direct-messages": MESSAGES, "hubpool-messages-native": MESSAGES, "direct": CHAT, "hubpool-1hop": MESSAGES}
#: one real Claude Code request, keys and prose scrubbed (tests/real_clients/scrub_capture.py); in a
#: source checkout only: an installed wheel has no tests/, and the bench then skips those figures
CLAUDE_CODE_FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "real_clients" / "data" / "claude-code.json"
#: the captured headers a replay leaves to its own HTTP client
_TRANSPORT = {"connection", "accept-encoding", "user-agent"}


def claude_code_request(model: str, stream: bool, tokens: int) -> tuple[str, dict[str, str], dict[str, Any]] | None:
    """(query string, headers, body) of the captured Claude Code turn asking ``model`` for
    ``tokens`` tokens, or None when the fixture is not here (not a source checkout)."""
    try:
        fixture = json.loads(CLAUDE_CODE_FIXTURE.read_text())
    except (OSError, ValueError):
        return None
    query = fixture["path"].partition("?")[2]
    headers = {k: v for k, v in fixture["headers"].items() if k.lower() not in _TRANSPORT}
    return ("?" + query if query else ""), headers, {**fixture["body"], "model": model, "stream": stream,
                                                       "max_tokens": tokens}


def start(started: procs.Started, targets: dict[str, Any], target_cls: Any, engine_var: str,
          engine_vars: list[str], pace_ms: float, tokens: int) -> str | None:
    """Start the native stub and its node and add both as targets; why not, when it cannot."""
    url, stub = procs.start_stub(started, pace_ms, tokens, name="stub-messages", version=NATIVE_VERSION)
    node = procs.start_nodes(started, {NATIVE_NODE: {engine_var: url}}, engine_vars)[NATIVE_NODE]
    engines = node.op("GET", "/status")["localNode"]["backends"]
    if not any("messages" in (b.get("dialects") or []) for b in engines):
        return (f"the engine plugin behind {engine_var} does not serve /v1/messages natively for a stub naming "
                f"version {NATIVE_VERSION}: native figures skipped")
    targets["direct-messages"] = target_cls("direct-messages", url, [stub.pid])
    targets["hubpool-messages-native"] = target_cls("hubpool-messages-native", node.url, [node.proc.pid])
    return None


def run_rounds(one: Callable[..., Any], targets: dict[str, Any], scenario_cls: Any, rounds: int, quick: bool,
               prompt: list[dict[str, Any]], tokens: int, progress: Callable[[str], None]) -> list[Any]:
    """Each Messages scenario in interleaved rounds over the arms present. The Claude Code
    turn goes to every arm with its query string and headers (``anthropic-beta`` and all);
    the translated arm's baseline, the engine's own chat completions, gets the same body."""
    arms = [name for name in ARMS if name in targets]
    runs = []
    for name, stream, n, kind in SCENARIOS["quick" if quick else "full"]:
        query = ""
        headers: dict[str, str] = {}
        body = {"model": FAST, "messages": prompt, "stream": stream, "max_tokens": tokens}
        if kind == "claude-code":
            captured = claude_code_request(FAST, stream, tokens)
            if captured is None:
                continue
            query, headers, body = captured
        scenario = scenario_cls(name, FAST, stream, 1, n)
        for rnd in range(rounds):
            order = arms[rnd % len(arms):] + arms[:rnd % len(arms)]
            for arm in reversed(order) if rnd % 2 else order:
                progress(f"{name} round {rnd + 1}/{rounds}: {arm}")
                path = ARMS[arm] + (query if ARMS[arm] == MESSAGES else "")
                runs.append(one(targets[arm], scenario, rnd, path=path, body=body, headers=headers))
    return runs


def judge(report: Any, per_round: Callable[..., float | None], goal: Callable[..., dict[str, Any]],
          judge_ok: Callable[[bool | None], str], fmt: Callable[..., str], skipped: str | None) -> None:
    """G1 and G2 for /v1/messages, native and translated, with the bounds of G1 and G2: for
    the short prompt, and for the captured Claude Code turn (ids ending -claude-code)."""
    added = lambda key: lambda a, b: a[key] - b[key]  # noqa: E731
    cc = " with a real Claude Code turn (48 KB)"
    for gid, scenario, key, text, bounds in (
            ("G1-messages", "messages-nonstream-c1", "total", "/v1/messages non-streamed, 1 client: added latency "
                                                              "p50 ≤ 0.7 ms, p99 ≤ 3 ms", (0.7, 3.0)),
            ("G2-messages", "messages-stream-c1", "ttfb", "/v1/messages streamed, 1 client: added time to first "
                                                          "byte p50 ≤ 1 ms, p99 ≤ 3 ms", (1.0, 3.0)),
            ("G1-messages-claude-code", "messages-claude-code-nonstream-c1", "total",
             f"/v1/messages non-streamed{cc}, 1 client: added latency p50 ≤ 0.7 ms, p99 ≤ 3 ms", (0.7, 3.0)),
            ("G2-messages-claude-code", "messages-claude-code-stream-c1", "ttfb",
             f"/v1/messages streamed{cc}, 1 client: added time to first byte p50 ≤ 1 ms, p99 ≤ 3 ms", (1.0, 3.0))):
        if gid.endswith("-claude-code") and not any(r.scenario == scenario for r in report.runs):
            report.goals.append(goal(gid, text, "n/a", judge_ok(None),
                                     f"no {CLAUDE_CODE_FIXTURE.name} here (a source checkout has it)"))
            continue
        parts, oks = [], []
        for label, hub, base in (("native", "hubpool-messages-native", "direct-messages"),
                                 ("translated", "hubpool-1hop", "direct")):
            if not report.of(hub, scenario):
                parts.append(f"{label} n/a")
                continue
            p50 = per_round(report, hub, base, scenario, added(f"{key}_p50"))
            p99 = per_round(report, hub, base, scenario, added(f"{key}_p99"))
            parts.append(f"{label} +{fmt(p50, ' ms')} p50, +{fmt(p99, ' ms')} p99")
            oks.append(None if p50 is None or p99 is None else p50 <= bounds[0] and p99 <= bounds[1])
        verdict = judge_ok(None if not oks or None in oks else all(oks))
        note = "translated: against the engine's own chat completion"
        report.goals.append(goal(gid, text, "; ".join(parts), verdict, f"{skipped} {note}" if skipped else note))
