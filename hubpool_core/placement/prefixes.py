"""Which prompt prefixes each engine holds, as far as this node has sent them (hubpool's own,
docs/placement.md "Shared prefixes"): a block-hash index.

A prompt is read as blocks of :data:`BLOCK_BYTES` (256 tokens at the pool's four bytes a
token), each block's hash chained to the one before, so two prompts share their first ``n``
hashes exactly when they share their first ``n`` blocks. Per engine the index keeps the
chains of the last prompts sent there — as many as the engine runs at once (a llama-server
slot keeps the prompt it last read), a prompt that extends one it holds replacing it — and
answers how many tokens of a new prompt the engine already holds: the longest run of leading
blocks any of its chains has. A fleet's sessions that start with the same system prompt and
tool list match on that head wherever any of them ran; a session's next turn matches its
whole previous prompt where it last ran. Pure bookkeeping in memory; nothing of the prompt is
kept but 8-byte hashes, and nothing is logged.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: bytes a block covers: 256 tokens at the pool's estimate (bytes / 4)
BLOCK_BYTES = 1024
#: how long a chain is believed held without a newer placement there (the affinity TTL's default)
DEFAULT_TTL_S = 600.0
#: chains kept per engine when its slot count is not known
DEFAULT_PER_ENGINE = 4
#: at most this many chains per engine, whatever it states
MAX_PER_ENGINE = 16
#: engines the index tracks (least recently placed dropped first)
MAX_ENGINES = 256
#: a prompt longer than this is indexed on its head only (4 MiB: 16k blocks)
MAX_BLOCKS = 4096


def prompt_bytes(body: Mapping[str, Any]) -> bytes:
    """The text an engine's prompt cache sees first, in order: each chat message's role and
    content (``cache_control`` marks left out, as an agent moves them between turns), else
    the completion's ``system`` and ``prompt``; Messages' ``system`` first, Responses'
    ``instructions`` and ``input``."""
    parts: list[str] = []
    for key in ("system", "instructions"):
        value = body.get(key)
        if value:
            parts.append(_text(value))
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, Mapping):
                parts.append(f"{m.get('role')}\0{_text(m.get('content'))}")
    for key in ("input", "prompt"):
        value = body.get(key)
        if value:
            parts.append(_text(value))
    return "\0".join(parts).encode("utf-8", "surrogatepass")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(without_cache_marks(value), ensure_ascii=False, separators=(",", ":"), sort_keys=True,
                      default=str)


def without_cache_marks(value: Any) -> Any:
    """``value`` without its ``cache_control`` marks: a client moves them between turns, and the
    prompt they mark is the same."""
    if isinstance(value, dict):
        return {k: without_cache_marks(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [without_cache_marks(v) for v in value]
    return value


def block_chain(data: bytes, model: str = "") -> tuple[bytes, ...]:
    """The chained hashes of ``data``'s whole blocks (a last partial block is not cached
    reusably by any engine either). The model seeds the chain: a cache is per loaded model."""
    out = []
    previous = hashlib.blake2b(model.encode("utf-8", "replace"), digest_size=8).digest()
    for at in range(0, min(len(data), MAX_BLOCKS * BLOCK_BYTES) - BLOCK_BYTES + 1, BLOCK_BYTES):
        previous = hashlib.blake2b(previous + data[at:at + BLOCK_BYTES], digest_size=8).digest()
        out.append(previous)
    return tuple(out)


class PrefixIndex:
    """(node, engine kind) -> the chains of the prompts last sent there."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.clock = clock
        #: engine -> {last hash of a chain: (chain, when placed)}, oldest first
        self._engines: OrderedDict[tuple[str, str], OrderedDict[bytes, tuple[tuple[bytes, ...], float]]] = \
            OrderedDict()

    def _live(self, engine: tuple[str, str]) -> OrderedDict[bytes, tuple[tuple[bytes, ...], float]]:
        held = self._engines.get(engine)
        if held is None:
            return OrderedDict()
        now = self.clock()
        for key in [k for k, (_, at) in held.items() if now - at >= self.ttl_s]:
            del held[key]
        return held

    def remember(self, node: str, backend: str, chain: Sequence[bytes], capacity: int | None = None) -> None:
        """``chain`` was just sent to the engine. A chain it extends (the same session's
        previous turn) is replaced; past ``capacity`` chains (its slots) the oldest goes."""
        if not chain:
            return
        engine = (node, backend)
        held = self._live(engine)
        members = set(chain)
        for key in [k for k in held if k in members]:
            del held[key]  # a prefix of this one: the slot that held it now holds this
        held[chain[-1]] = (tuple(chain), self.clock())
        keep = min(MAX_PER_ENGINE, capacity or DEFAULT_PER_ENGINE)
        while len(held) > keep:
            held.popitem(last=False)
        self._engines[engine] = held
        self._engines.move_to_end(engine)
        while len(self._engines) > MAX_ENGINES:
            self._engines.popitem(last=False)

    def forget(self, node: str, backend: str, chain: Sequence[bytes]) -> None:
        """``chain`` never reached the engine after all (the attempt failed or was turned back)."""
        held = self._engines.get((node, backend))
        if held is not None and chain and held.get(chain[-1], ((),))[0] == tuple(chain):
            del held[chain[-1]]

    def held_tokens(self, node: str, backend: str, chain: Sequence[bytes]) -> int:
        """Tokens (pool estimate) of the prompt behind ``chain`` the engine holds: its longest
        run of leading blocks shared with a chain the engine was sent."""
        best = 0
        for stored, _ in self._live((node, backend)).values():
            n = 0
            for a, b in zip(stored, chain, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best * BLOCK_BYTES // 4

    def shared_head(self, chain: Sequence[bytes]) -> int:
        """Tokens of the prompt behind ``chain`` that another prompt shares: the longest run of
        leading blocks a chain sent to any engine has in common with it, not counting a chain
        that is a whole prefix of it (its own session's earlier turn, as far as whole blocks can
        tell). A fleet's system prompt and tool list are such a head; an agent session's own
        context is not."""
        best = 0
        for held in self._engines.values():
            for stored, _ in held.values():
                n = 0
                for a, b in zip(stored, chain, strict=False):
                    if a != b:
                        break
                    n += 1
                if n < len(stored):  # it went on differently: another prompt
                    best = max(best, n)
        return best * BLOCK_BYTES // 4

    def sessions(self, node: str, backend: str) -> int:
        """How many distinct prompts the engine holds now (each a session's, as far as this
        node sent them): what spreading sessions counts."""
        return len(self._live((node, backend)))
