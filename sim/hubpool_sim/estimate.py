"""What the engine knows and a dispatcher can only guess: when a request sent now would get
its first token here (``POST /_sim/estimate``, the bench's oracle reads it).

The engine knows every slot's planned end, the waiters ahead, each slot's cached prompt and
which models are resident, so it can play the queue forward: each waiter takes the slot
that frees first, then the new request does, and pays the model load when the model is not
resident and the prefill of the part of its prompt that slot does not hold. The answer is in
the engine's reported (unscaled) milliseconds.
"""

from __future__ import annotations

import heapq
import time

from hubpool_sim.config import SimModel
from hubpool_sim.engine import Engine
from hubpool_sim.text import common_prefix, count_tokens


def first_token_ms(engine: Engine, model: SimModel, prompt: bytes, max_tokens: int | None = None) -> float:
    """Milliseconds (unscaled) until a request for ``model`` with ``prompt`` sent now would
    have its first token."""
    config, pool = engine.config, engine.pool
    scale = config.time_scale
    now = time.monotonic()
    free_at = [max(0.0, (s.busy_until - now) / scale) if s.busy else 0.0
               for s in pool.slots if s.id < pool.size]
    heapq.heapify(free_at)
    # each waiter holds its slot for its own prompt and its own answer (max_tokens when it set
    # one): counted at the engine's default answer length, a queue of 250-token answers read as
    # 8-token ones and the oracle piled requests behind it (docs/performance.md)
    for fut, _model, waiting, answer_tokens in list(pool._waiters):  # noqa: SLF001 - the engine's own queue
        if fut.done():
            continue
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + config.prefill_s(count_tokens(waiting)) + answer_tokens * config.token_delay_s)
    start = heapq.heappop(free_at) if free_at else 0.0
    tokens = count_tokens(prompt)
    cached = 0
    if config.prompt_cache:
        cached = max((common_prefix(s.prompt, prompt) // 4 for s in pool.slots if s.model == model.id), default=0)
        cached = min(cached, max(0, tokens - 1))
    load = config.load_ms / 1000.0 if model.id not in engine.resident else 0.0
    first = config.token_delay_s
    return (start + load + config.prefill_s(tokens - cached) + first) * 1000.0
