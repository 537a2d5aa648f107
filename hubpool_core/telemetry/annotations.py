"""The ↳ notes that explain a routing-log row to a person: why it ended as it did, and what
shaped its placement. `hubpool log` prints them and the web UI shows them, so the terminal and
the page say the same thing (protocol.md §5a, §5c; spec: Client hang-ups, A request no node can
serve, A 200 that is not an answer)."""

# no `from __future__ import annotations`: it binds the name `annotations`, which this module's
# annotations() would shadow
from typing import Any

#: requestError signatures in words (never the engine's message, which can quote the prompt)
SIGNATURES = {
    "no-user-query": "no user turn in the conversation",
    "missing-messages": "a chat body with no messages",
    "invalid-message": "a malformed message",
    "context-length": "prompt longer than the context window",
    "chat-template": "a chat template that would not render",
    "truncated-upstream": "the node's answer was cut off",
    "degenerate-output": "placeholder output (<unusedN> tokens only)",
}
BASES = {
    "definitive": "no node could have answered it",
    "confirmed": "a second node agreed",
    "last-candidate": "no candidate was left to ask",
}


def request_error_text(e: dict[str, Any]) -> str:
    err = e["requestError"]
    sig, basis = err.get("signature"), err.get("basis")
    if sig == "client-error":
        return f"refused by the engine (HTTP {e.get('status') or '?'}) — passed to the app as the request's fault"
    words = SIGNATURES.get(sig, str(sig))
    if basis == "node":
        return f"bad answer from {e.get('node') or 'the node'}: {words} — the node's fault, not the request's"
    why = BASES.get(basis, str(basis))
    if basis == "confirmed" and err.get("confirms"):
        why = f"{err['confirms']} said the same"
    return f"refused as a bad request: {words} ({why})"


def annotations(e: dict[str, Any]) -> list[str]:
    """The ↳ lines under one row: why it ended as it did, and what shaped its placement."""
    notes = []
    inbound = e.get("direction") == "inbound"
    node = e.get("node") or "the node"
    if e.get("clientClosed"):
        if e.get("status") is None:
            ms = e.get("durationMs") if e.get("durationMs") is not None else e.get("totalMs")
            if inbound:
                notes.append(f"{node} closed its forward after {ms} ms; this node's engine had not answered yet "
                             "— not a failure here")
            else:
                notes.append(f"the app closed its connection after {ms} ms; {node} had not answered yet "
                             "— not a routing failure")
        else:
            who = f"{node} closed its forward" if inbound else "the app closed its connection"
            notes.append(f"{who} mid-answer after {e.get('totalMs')} ms — not a routing failure")
    if e.get("requestError"):
        notes.append(request_error_text(e))
    for cut in e.get("resumedFrom") or []:
        if isinstance(cut, dict):
            notes.append(f"resumed: {cut.get('node')}'s {cut.get('backend')} was cut at {cut.get('atChars')} "
                         f"characters ({cut.get('reason')}); the next candidate continued the same stream")
    if e.get("keepAlive"):
        notes.append("kept alive: the app had its 200 and keep-alives before any node answered")
    if e.get("requestedModel"):
        asked = e["requestedModel"]
        how = "auto" if asked == "auto" else "a model alias (poolModelAliases): no node serves that name"
        notes.append(f"asked for {asked}, placed as {e.get('model')} — {how}")
    pin = e.get("pin")
    if pin:
        scope = "a model pin" if pin.get("scope") == "model" else "the default pin"
        target = "this node" if pin.get("targetKind") == "local" else "a peer"
        notes.append(f"pinned: {scope} put {target} first ({pin.get('mode', 'prefer')})")
    notes += _placement(e)
    failed_over = e.get("failedOverFrom") or []
    if failed_over:
        attempts = e.get("attempts") or []
        parts = []
        for i, name in enumerate(failed_over):
            reason = attempts[i].get("reason") if i < len(attempts) and isinstance(attempts[i], dict) else None
            parts.append(f"{name} ({reason})" if reason else name)
        notes.append("failed over from " + ", ".join(parts))
    if e.get("outcome") == "failed" and not e.get("clientClosed") and not e.get("requestError") and e.get("reason"):
        reason = e["reason"]
        if reason == "no candidate":
            notes.append("no pool node had this model available, so nothing was tried")
        elif failed_over and e.get("status") == 502:
            notes.append(f"every candidate failed; the last: {reason}")
        else:
            notes.append(reason)
    if e.get("localLoadRefused"):
        notes.append(f"local load refused, but no other candidate was left: {e['localLoadRefused']}")
    return notes


def _placement(e: dict[str, Any]) -> list[str]:
    """Short notes for the placement sections a row may carry (null when they did nothing)."""
    notes = []
    ceiling = e.get("promptCeiling")
    if isinstance(ceiling, dict) and ceiling.get("excluded"):
        moved = ", ".join(f"{x.get('node')} (max {x.get('maxPromptTokens')})" for x in ceiling["excluded"])
        notes.append(f"ceiling: ~{ceiling.get('estimatedTokens')} tokens moved {moved} back"
                     + (" (overridden: nothing else could serve)" if ceiling.get("overridden") else ""))
    cap = e.get("contextCap")
    if isinstance(cap, dict) and cap.get("excluded"):
        moved = ", ".join(f"{x.get('node')} (cap {x.get('maxNumCtx')})" for x in cap["excluded"])
        notes.append(f"cap: a {cap.get('numCtx')}-token window moved {moved} back")
    slots = e.get("slots")
    if isinstance(slots, dict) and slots.get("demoted"):
        moved = ", ".join(f"{x.get('node')} ({x.get('inFlight')}/{x.get('slots')} slots)" for x in slots["demoted"])
        notes.append(f"slots: full engines moved back: {moved}")
    tp = e.get("throughput")
    if isinstance(tp, dict) and (tp.get("estimates") or tp.get("slowerDemoted")):
        slow = [f"{x.get('node')} (~{x.get('predictedMs')} ms)" for x in tp.get("estimates") or [] if x.get("slow")]
        if slow:
            notes.append("throughput: predicted to miss the budget: " + ", ".join(slow))
        for x in tp.get("slowerDemoted") or []:
            notes.append(f"throughput: {x.get('fasterNode')} (~{x.get('fasterMs')} ms) went ahead of "
                         f"{x.get('node')} (~{x.get('predictedMs')} ms)")
    contention = e.get("contention")
    if isinstance(contention, dict) and contention.get("demoted"):
        for x in contention["demoted"]:
            busy = ", ".join(str(b.get("model")) for b in x.get("busyWith") or [])
            notes.append(f"contention: {x.get('node')}'s {x.get('backend')} was busy with {busy or 'other work'}")
    affinity = e.get("affinity")
    if isinstance(affinity, dict) and affinity.get("outcome") in ("hit", "miss"):
        notes.append(f"affinity: {affinity['outcome']}")
    return notes
