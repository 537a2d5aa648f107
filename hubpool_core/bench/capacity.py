"""`hubpool bench capacity`: how many concurrent streams a model takes before its time to
first token breaks an SLO.

Concurrency is raised step by step (1, 2, 4, ... up to ``max_concurrency``, or the levels
given); at each step ``c`` clients stream requests back to back for ``duration_s``, and the
step meets the SLO when the chosen percentile of time to first token is within it and no
request failed. The run stops at the first step that breaks it; the answer is the last
level that met it.

Prompts are unique by default (a per-request nonce leads the prompt, so no prompt cache
helps); ``shared_prefix`` sends byte-identical prompts, the best case for an engine with
a prefix cache. Time to first token is the first streamed chunk that carries text.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from hubpool_core.bench.loadgen import percentile

NATIVE_ROUTES = ("/api/chat", "/api/generate")
FILLER = "Summarise the following notes in one sentence. "


def levels_up_to(max_concurrency: int) -> list[int]:
    """1, 2, 4, ... doubling, ending exactly at ``max_concurrency``."""
    out, c = [], 1
    while c < max_concurrency:
        out.append(c)
        c *= 2
    out.append(max_concurrency)
    return out


def prompt_text(prompt_tokens: int, nonce: str | None) -> str:
    """About ``prompt_tokens`` tokens (4 bytes each); a nonce first makes it unique."""
    body = (FILLER * (prompt_tokens * 4 // len(FILLER) + 1))[: prompt_tokens * 4]
    return body if nonce is None else f"[{nonce}] {body}"


def request_body(route: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A streamed request in the route's dialect."""
    if route == "/api/generate":
        return {"model": model, "prompt": prompt, "stream": True, "options": {"num_predict": max_tokens}}
    if route in NATIVE_ROUTES:
        return {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
                "options": {"num_predict": max_tokens}}
    if route == "/v1/completions":
        return {"model": model, "prompt": prompt, "stream": True, "max_tokens": max_tokens}
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": max_tokens}


def carries_text(chunk: bytes) -> bool:
    """Whether a streamed chunk holds generated text (not only a role or a keep-alive)."""
    for line in chunk.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if not line or line == b"[DONE]":
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        for choice in obj.get("choices") or []:
            if isinstance(choice, dict):
                delta = choice.get("delta") or {}
                if (isinstance(delta, dict) and delta.get("content")) or choice.get("text"):
                    return True
        message = obj.get("message")
        if (isinstance(message, dict) and message.get("content")) or obj.get("response"):
            return True
        if obj.get("done") is True:
            return True  # a native answer that ends without text still answered
    return False


class CapacityError(Exception):
    """The run could not start: the first request already failed (the sentence says how)."""


@dataclass
class Step:
    """One concurrency level, measured."""

    concurrency: int
    requests: int = 0
    failed: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def figures(self, pct: float, slo_ms: float) -> dict[str, Any]:
        ttft, total = sorted(self.ttft_ms), sorted(self.total_ms)
        at_pct = percentile(ttft, pct)
        return {
            "concurrency": self.concurrency, "requests": self.requests, "failed": self.failed,
            "ttftP50Ms": _r(percentile(ttft, 50)), f"ttftP{pct:g}Ms": _r(at_pct),
            "ttftMaxMs": _r(ttft[-1] if ttft else None),
            "totalP50Ms": _r(percentile(total, 50)),
            "requestsPerS": round(len(total) / self.wall_s, 2) if self.wall_s else 0.0,
            "metSlo": bool(self.requests) and self.failed == 0 and at_pct is not None and at_pct <= slo_ms,
            "errors": self.errors[:3],
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


async def run_step(session: aiohttp.ClientSession, url: str, route: str, model: str, concurrency: int,
                   duration_s: float, prompt_tokens: int, max_tokens: int, shared_prefix: bool,
                   headers: dict[str, str], tick: Callable[[], None] = lambda: None) -> Step:
    """``concurrency`` clients streaming back to back for ``duration_s`` (requests under way
    then finish; each is bounded by the session's timeout)."""
    step = Step(concurrency)
    shared = prompt_text(prompt_tokens, None)
    stop_at = time.perf_counter() + duration_s

    async def client() -> None:
        first_round = True
        while first_round or time.perf_counter() < stop_at:  # every client sends at least one request
            first_round = False
            prompt = shared if shared_prefix else prompt_text(prompt_tokens, uuid.uuid4().hex)
            payload = request_body(route, model, prompt, max_tokens)
            t0 = time.perf_counter()
            step.requests += 1
            try:
                async with session.post(url + route, json=payload, headers=headers) as resp:
                    if resp.status != 200:
                        text = (await resp.read())[:200].decode("utf-8", "replace")
                        step.failed += 1
                        step.errors.append(f"HTTP {resp.status}: {text}")
                        return  # the level has failed already: no point hammering an error
                    first = None
                    async for chunk in resp.content.iter_any():
                        if first is None and carries_text(chunk):
                            first = time.perf_counter()
                    end = time.perf_counter()
                if first is None:
                    step.failed += 1
                    step.errors.append("the stream ended without any text")
                    return
                step.ttft_ms.append((first - t0) * 1000)
                step.total_ms.append((end - t0) * 1000)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                step.failed += 1
                step.errors.append(f"{type(exc).__name__}: {exc}")
                return
            finally:
                tick()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    step.wall_s = time.perf_counter() - started
    return step


async def run_capacity(url: str, model: str, *, route: str = "/v1/chat/completions", slo_ttft_ms: float = 1000.0,
                       pct: float = 95.0, levels: list[int], duration_s: float = 10.0, prompt_tokens: int = 256,
                       max_tokens: int = 64, shared_prefix: bool = False, api_key: str | None = None,
                       request_timeout_s: float = 120.0,
                       on_step: Callable[[int, dict[str, Any] | None], None] = lambda _c, _f: None,
                       tick: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Raise concurrency through ``levels`` until the SLO breaks; the report as a dict."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    steps: list[dict[str, Any]] = []
    capacity = 0
    broke_at = None
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=10)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        # one request first, not counted: a model loading or a cold connection is not capacity
        warm = await run_step(session, url.rstrip("/"), route, model, 1, 0.0, prompt_tokens, max_tokens,
                              shared_prefix, headers)
        if warm.failed:
            raise CapacityError(f"the first request to {url.rstrip('/')}{route} failed, so no level was tried: "
                                f"{warm.errors[0][:300]}")
        for c in levels:
            on_step(c, None)
            step = await run_step(session, url.rstrip("/"), route, model, c, duration_s, prompt_tokens, max_tokens,
                                  shared_prefix, headers, tick)
            figures = step.figures(pct, slo_ttft_ms)
            steps.append(figures)
            on_step(c, figures)
            if not figures["metSlo"]:
                broke_at = c
                break
            capacity = c
    return {"url": url, "route": route, "model": model, "sloTtftMs": slo_ttft_ms, "percentile": pct,
            "prompts": "shared-prefix" if shared_prefix else "unique", "promptTokens": prompt_tokens,
            "maxTokens": max_tokens, "durationPerStepS": duration_s, "levels": levels,
            "capacity": capacity, "brokeAt": broke_at, "steps": steps}
