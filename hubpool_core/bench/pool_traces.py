"""Traces for ``hubpool bench pool``: the built-in shapes (chat, agents, burst, cold), the file
format users can supply their own in, and the bodies a trace's requests are sent as.

A trace file is JSON Lines. The first line is the header, every other line one request::

    {"format": "hubpool-trace/1", "name": "agents", "description": "...", "sloMs": 10000}
    {"at": 0.0, "entry": 0, "session": "s0", "promptTokens": 6200, "outputTokens": 120}
    {"at": 0.0, "entry": 0, "session": "s0", "gap": 4.5, "promptTokens": 6900, "outputTokens": 80}
    {"at": 3.2, "entry": 2, "promptTokens": 900, "outputTokens": 200, "model": "cold"}
    {"at": 1.0, "entry": 1, "session": "f3", "prefix": "agent", "prefixTokens": 16000, "promptTokens": 17500,
     "outputTokens": 150}

Times are seconds of the simulated (unscaled) clock. ``at`` is when a request is sent. A
request with a ``session`` is sent in its session's order: no sooner than ``at`` and no
sooner than ``gap`` seconds after the session's previous request was answered (an agent
thinks between turns). A session's prompts share their bytes: each turn's prompt is the
previous one's with more appended, so an engine's prompt cache can serve the shared part.
Prompts without a session are unique. ``prefix`` names a prompt head that every request
naming it starts with (``prefixTokens`` of it: one agent's system prompt and tool list,
shared by all its sessions); the session's own text follows it. ``entry`` is the node the request enters the pool at
(an app talks to its own node; dispatchers with one front door ignore it), taken modulo
the pool's size. ``model`` is ``chat`` (the default) or ``cold``, the model the cold trace
asks for, which only one node holds in memory at the start. ``sloMs`` is the trace's
time-to-first-token objective for goodput.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "hubpool-trace/1"
BUILT_IN = ("chat", "agents", "fleet", "burst", "cold")
#: bytes per token: the pool's own estimate, and the simulator's
TOKEN_BYTES = 4


@dataclass(frozen=True)
class NodeSpec:
    """One simulated box: how many requests it runs at once and how fast it reads and writes."""

    name: str
    slots: int
    prefill_tps: float
    decode_tps: float
    load_ms: float = 20_000.0

    @property
    def capacity_rps(self) -> float:
        """Requests a second it serves of a mean chat request (4,000 prompt tokens, 150 out)."""
        service = 4000 / self.prefill_tps + 150 / self.decode_tps
        return self.slots / service


#: the issue's three unequal llama-server-shaped boxes
UNEQUAL = (NodeSpec("fast", 4, 4000, 50), NodeSpec("mid", 2, 1500, 25), NodeSpec("slow", 1, 400, 10))
#: three equal boxes of two slots
EQUAL = (NodeSpec("eq-a", 2, 1500, 25), NodeSpec("eq-b", 2, 1500, 25), NodeSpec("eq-c", 2, 1500, 25))
POOLS = {"unequal": UNEQUAL, "equal": EQUAL}


@dataclass
class TraceRequest:
    at: float
    prompt_tokens: int
    output_tokens: int
    entry: int = 0
    session: str | None = None
    gap: float | None = None
    model: str = "chat"
    #: a prompt head shared with every request naming it, and its size in tokens
    prefix: str | None = None
    prefix_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"at": round(self.at, 3), "entry": self.entry, "promptTokens": self.prompt_tokens,
                               "outputTokens": self.output_tokens}
        if self.session is not None:
            out["session"] = self.session
        if self.prefix is not None:
            out["prefix"] = self.prefix
            out["prefixTokens"] = self.prefix_tokens
        if self.gap is not None:
            out["gap"] = round(self.gap, 3)
        if self.model != "chat":
            out["model"] = self.model
        return out


@dataclass
class Trace:
    name: str
    requests: list[TraceRequest]
    slo_ms: float = 5000.0
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def span_s(self) -> float:
        """The last planned send time (simulated seconds)."""
        return max((r.at for r in self.requests), default=0.0)

    def header(self) -> dict[str, Any]:
        return {"format": FORMAT, "name": self.name, "description": self.description, "sloMs": self.slo_ms,
                **self.extra}

    def dumps(self) -> str:
        return "\n".join(json.dumps(x) for x in [self.header(), *(r.to_json() for r in self.requests)]) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {"header": self.header(), "requests": [r.to_json() for r in self.requests]}


class TraceError(ValueError):
    """A trace file the bench cannot replay; the message says which line and why."""


def _positive_int(value: Any, what: str, line: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TraceError(f"line {line}: {what} must be a whole number of at least 1, got {value!r}")
    return value


def _seconds(value: Any, what: str, line: int) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise TraceError(f"line {line}: {what} must be a number of seconds, 0 or more, got {value!r}")
    return float(value)


def parse(text: str, name: str = "trace") -> Trace:
    """A trace from the text of a trace file (see the module docstring)."""
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
    if not lines:
        raise TraceError("the trace is empty: its first line is the header, then one request a line")
    requests: list[TraceRequest] = []
    header: dict[str, Any] = {}
    for number, line in lines:
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise TraceError(f"line {number}: not JSON ({exc})") from None
        if not isinstance(item, dict):
            raise TraceError(f"line {number}: expected a JSON object")
        if number == lines[0][0]:
            if item.get("format") != FORMAT:
                raise TraceError(f"line {number}: the header must say \"format\": \"{FORMAT}\"")
            header = item
            continue
        session = item.get("session")
        model = item.get("model", "chat")
        if session is not None and not isinstance(session, str):
            raise TraceError(f"line {number}: session must be a string")
        if model not in ("chat", "cold"):
            raise TraceError(f"line {number}: model must be \"chat\" or \"cold\", got {model!r}")
        entry = item.get("entry", 0)
        if not isinstance(entry, int) or isinstance(entry, bool) or entry < 0:
            raise TraceError(f"line {number}: entry must be a node index, 0 or more")
        prefix = item.get("prefix")
        if prefix is not None and not isinstance(prefix, str):
            raise TraceError(f"line {number}: prefix must be a string")
        prefix_tokens = _positive_int(item.get("prefixTokens"), "prefixTokens", number) if prefix is not None else 0
        requests.append(TraceRequest(
            at=_seconds(item.get("at", 0.0), "at", number),
            prompt_tokens=_positive_int(item.get("promptTokens"), "promptTokens", number),
            output_tokens=_positive_int(item.get("outputTokens"), "outputTokens", number),
            entry=entry, session=session,
            gap=_seconds(item["gap"], "gap", number) if item.get("gap") is not None else None,
            model=model, prefix=prefix, prefix_tokens=prefix_tokens))
        if prefix is not None and prefix_tokens >= requests[-1].prompt_tokens:
            raise TraceError(f"line {number}: prefixTokens must be less than promptTokens (the session's own "
                             "text follows the shared head)")
    slo = header.get("sloMs", 5000.0)
    if not isinstance(slo, (int, float)) or isinstance(slo, bool) or slo <= 0:
        raise TraceError("the header's sloMs must be a positive number of milliseconds")
    extra = {k: v for k, v in header.items() if k not in ("format", "name", "description", "sloMs")}
    return Trace(str(header.get("name") or name), requests, float(slo), str(header.get("description") or ""), extra)


def load(path: Path) -> Trace:
    return parse(path.read_text(encoding="utf-8"), path.stem)


# -- the built-in shapes --------------------------------------------------------------

def pool_capacity(nodes: tuple[NodeSpec, ...]) -> float:
    return sum(n.capacity_rps for n in nodes)


def chat(seed: int, nodes: tuple[NodeSpec, ...], duration_s: float = 240.0, utilisation: float = 0.57) -> Trace:
    """Short unique prompts (100–16k tokens, log-uniform) arriving as a Poisson process at
    ``utilisation`` of the pool's capacity, entering at every node alike."""
    rng = random.Random(f"chat:{seed}")
    rate = utilisation * pool_capacity(nodes)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration_s:
            break
        tokens = int(math.exp(rng.uniform(math.log(100), math.log(16_000))))
        out.append(TraceRequest(t, tokens, rng.randint(50, 250), entry=rng.randrange(len(nodes))))
    return Trace("chat", out, 5000.0, f"Poisson chat at {utilisation:.0%} of capacity for {duration_s:g} s")


def agents(seed: int, nodes: tuple[NodeSpec, ...], sessions: int = 6, turns: int = 12) -> Trace:
    """``sessions`` agent sessions of ``turns`` turns: a 6–20k-token prefix that grows by a
    few hundred to two thousand tokens a turn, a few seconds of thinking between turns; each
    session enters at one node (its app's)."""
    rng = random.Random(f"agents:{seed}")
    out = []
    for s in range(sessions):
        tokens = rng.randint(6_000, 20_000)
        start = rng.uniform(0, 20)
        for k in range(turns):
            # every turn carries its session's start: the sort below keeps a session's turns in order
            # (a later turn at 0.0 once sorted before its first, which was then sent last)
            out.append(TraceRequest(start, tokens, rng.randint(60, 300), entry=s % len(nodes),
                                    session=f"agent-{seed}-{s}", gap=None if k == 0 else rng.uniform(2, 8)))
            tokens += rng.randint(300, 2_000)
    out.sort(key=lambda r: r.at)
    return Trace("agents", out, 10_000.0, f"{sessions} agent sessions of {turns} turns, 6–20k-token prefixes")


def fleet(seed: int, nodes: tuple[NodeSpec, ...], sessions: int = 12, turns: int = 6,
          shared_tokens: int = 16_000) -> Trace:
    """A fleet of one agent: ``sessions`` sessions whose prompts all start with the same
    ``shared_tokens``-token system prompt and tool list (as every Claude Code session's do),
    each followed by its own task context (1–4k tokens) that grows by a few hundred to two
    thousand tokens a turn, a few seconds of thinking between turns; sessions enter at every
    node alike and start over the first 30 s."""
    rng = random.Random(f"fleet:{seed}")
    out = []
    for s in range(sessions):
        tokens = shared_tokens + rng.randint(1_000, 4_000)
        start = rng.uniform(0, 30)
        for k in range(turns):
            out.append(TraceRequest(start, tokens, rng.randint(60, 300), entry=s % len(nodes),
                                    session=f"fleet-{seed}-{s}", gap=None if k == 0 else rng.uniform(2, 8),
                                    prefix=f"fleet-agent-{seed}", prefix_tokens=shared_tokens))
            tokens += rng.randint(300, 2_000)
    out.sort(key=lambda r: r.at)
    return Trace("fleet", out, 10_000.0, f"{sessions} sessions of one agent, {turns} turns, sharing a "
                                         f"{shared_tokens:,}-token system prompt and tool list")


def burst(seed: int, nodes: tuple[NodeSpec, ...], seconds: float = 30.0, factor: float = 3.0) -> Trace:
    """``factor`` times the pool's capacity for ``seconds``: short prompts, all at once."""
    rng = random.Random(f"burst:{seed}")
    rate = factor * pool_capacity(nodes)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > seconds:
            break
        out.append(TraceRequest(t, rng.randint(200, 2_000), rng.randint(50, 150), entry=rng.randrange(len(nodes))))
    return Trace("burst", out, 5000.0, f"{factor:g}× capacity for {seconds:g} s")


def cold(seed: int, nodes: tuple[NodeSpec, ...], count: int = 24, duration_s: float = 120.0) -> Trace:
    """A model resident on one node (``warmNode`` in the header) and on disk elsewhere:
    moderate chat traffic for it, the first requests arriving a few seconds apart."""
    rng = random.Random(f"cold:{seed}")
    warm = 1 if len(nodes) > 1 else 0
    times = sorted(rng.uniform(0, duration_s) for _ in range(count))
    out = [TraceRequest(t, rng.randint(200, 3_000), rng.randint(50, 150), entry=rng.randrange(len(nodes)),
                        model="cold") for t in times]
    return Trace("cold", out, 5000.0, "a model resident on one node, on disk elsewhere", {"warmNode": warm})


def built_in(name: str, seed: int, nodes: tuple[NodeSpec, ...], size: float = 1.0) -> Trace:
    """One of :data:`BUILT_IN`; ``size`` below 1 shortens it (tests and ``--quick``)."""
    if name == "chat":
        return chat(seed, nodes, duration_s=240.0 * size)
    if name == "agents":
        return agents(seed, nodes, sessions=max(1, round(6 * min(1.0, size * 2))), turns=max(2, round(12 * size)))
    if name == "fleet":
        return fleet(seed, nodes, sessions=max(2, round(12 * min(1.0, size * 2))), turns=max(2, round(6 * size)))
    if name == "burst":
        return burst(seed, nodes, seconds=max(2.0, 30.0 * size))
    if name == "cold":
        return cold(seed, nodes, count=max(3, round(24 * size)), duration_s=120.0 * size)
    raise TraceError(f"no built-in trace {name!r}: choose {', '.join(BUILT_IN)} or give a file")


# -- what is sent ---------------------------------------------------------------------

def _stream(key: str, nbytes: int) -> str:
    """Deterministic text of ``nbytes`` ASCII bytes for ``key``: the same key always starts
    with the same bytes, so a longer prompt extends a shorter one."""
    out: list[str] = []
    block = 0
    size = 0
    while size < nbytes:
        words = hashlib.sha256(f"{key}:{block}".encode()).hexdigest()
        piece = " ".join(words[i:i + 8] for i in range(0, 64, 8)) + " "
        out.append(piece)
        size += len(piece)
        block += 1
    return "".join(out)[:nbytes]


def messages_for(request: TraceRequest, index: int, earlier: list[int]) -> list[dict[str, str]]:
    """The chat messages for a request. ``earlier``: the prompt sizes of its session's
    earlier turns, oldest first (each turn's prompt is its predecessor's plus more, split
    into messages at those sizes, so the head — system prompt and first turn — is the same
    on every turn of a session and different between sessions)."""
    nbytes = request.prompt_tokens * TOKEN_BYTES
    if request.session is None:
        text = _stream(f"req:{index}", nbytes)
        head = max(0, nbytes - 200)
        return [{"role": "system", "content": text[:head]}, {"role": "user", "content": text[head:]}]
    text = _stream(f"session:{request.session}", nbytes)
    if request.prefix is not None:  # the shared head, then the session's own text
        head = request.prefix_tokens * TOKEN_BYTES
        text = _stream(f"prefix:{request.prefix}", head) + text[:max(0, nbytes - head)]
    first = earlier[0] * TOKEN_BYTES if earlier else nbytes
    cuts = [max(0, first - 400), first] + [t * TOKEN_BYTES for t in earlier[1:]] + [nbytes]
    # every turn after the system prompt is a user message: a role that changed between
    # turns would change the bytes an engine caches
    messages, at = [{"role": "system", "content": text[:cuts[0]]}], cuts[0]
    for cut in cuts[1:]:
        if cut > at:
            messages.append({"role": "user", "content": text[at:cut]})
            at = cut
    return messages


def spec_json(nodes: tuple[NodeSpec, ...]) -> list[dict[str, Any]]:
    return [asdict(n) for n in nodes]
