"""``hubpool bench pool``'s client: replays one trace against one dispatcher, in its own
process so its CPU is never a dispatcher's.

It stays up for the whole bench and answers one JSON line on stdout for each JSON line of
work on stdin::

    {"trace": {...}, "urls": {"chat": ["http://..."], "cold": [...]}, "models": {"chat": "m", "cold": "c"},
     "scale": 0.1, "deadlineS": 120, "path": "/v1/chat/completions"}

``urls`` are per trace model: one per entry node (a request goes to ``entry`` modulo their
number), or one front door. Requests are sent at their trace time (times the scale), sessions in order with their think
time after the previous answer; each is a streamed OpenAI chat request with ``max_tokens``.
Time to first token is the first chunk that carries text. Every figure is returned both as
measured and divided by the scale (the simulated clock the engines report in).

Run: ``python -m hubpool_core.bench.pool_replay`` (driven by :mod:`hubpool_core.bench.pool`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

from hubpool_core.bench.pool_traces import TraceRequest, messages_for

CHAT_PATH = "/v1/chat/completions"


def _requests(trace: dict[str, Any]) -> list[TraceRequest]:
    out = []
    for item in trace["requests"]:
        out.append(TraceRequest(at=item["at"], prompt_tokens=item["promptTokens"],
                                output_tokens=item["outputTokens"], entry=item.get("entry", 0),
                                session=item.get("session"), gap=item.get("gap"), model=item.get("model", "chat"),
                                prefix=item.get("prefix"), prefix_tokens=item.get("prefixTokens", 0)))
    return out


def _has_text(line: bytes) -> bool:
    """Whether an SSE data line carries generated text (a delta with content)."""
    if not line.startswith(b"data:") or b'"content"' not in line:
        return False
    try:
        frame = json.loads(line[5:])
        choice = (frame.get("choices") or [{}])[0]
        return bool((choice.get("delta") or {}).get("content") or choice.get("text"))
    except (ValueError, AttributeError, IndexError, TypeError):
        return False


async def replay(job: dict[str, Any]) -> dict[str, Any]:
    requests = _requests(job["trace"])
    urls: dict[str, list[str]] = job["urls"]
    models: dict[str, str] = job["models"]
    scale = float(job["scale"])
    path = job.get("path", CHAT_PATH)
    headers = {"Content-Type": "application/json", **job.get("headers", {})}
    results: list[dict[str, Any] | None] = [None] * len(requests)
    t0 = time.perf_counter() + 0.05
    deadline = t0 + float(job["deadlineS"])
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as http:

        async def one(i: int, req: TraceRequest, earlier: list[int]) -> None:
            body = {"model": models[req.model], "messages": messages_for(req, i, earlier), "stream": True,
                    "max_tokens": req.output_tokens}
            doors = urls[req.model]
            url = doors[req.entry % len(doors)] + path
            sent = time.perf_counter()
            row: dict[str, Any] = {"i": i, "entry": req.entry, "session": req.session,
                                   "model": req.model, "promptTokens": req.prompt_tokens,
                                   "sentAtS": round((sent - t0) / scale, 3), "status": None, "ttftMs": None,
                                   "e2eMs": None, "error": None}
            results[i] = row
            try:
                left = deadline - sent
                if left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):
                    async with http.post(url, data=json.dumps(body).encode(), headers=headers) as resp:
                        row["status"] = resp.status
                        row["sim"] = resp.headers.get("X-Sim-Name")
                        row["servedBy"] = resp.headers.get("X-Hub-Pool-Served-By")
                        queued = resp.headers.get("X-Hub-Pool-Queued-Ms")
                        row["queuedMs"] = int(queued) if queued and queued.isdigit() else None
                        if resp.status != 200:
                            row["error"] = (await resp.text())[:300]
                            return
                        buffer = b""
                        async for chunk in resp.content.iter_any():
                            if row["ttftMs"] is None:
                                buffer += chunk
                                lines = buffer.split(b"\n")
                                buffer = lines.pop()
                                if any(_has_text(ln.strip()) for ln in lines):
                                    row["realTtftMs"] = round((time.perf_counter() - sent) * 1000, 3)
                                    row["ttftMs"] = round(row["realTtftMs"] / scale, 3)
                        if row["ttftMs"] is None:
                            row["error"] = "the stream carried no text"
                        row["e2eMs"] = round((time.perf_counter() - sent) * 1000 / scale, 3)
            except TimeoutError:
                row["error"] = "not answered within the run's deadline"
            except (aiohttp.ClientError, ConnectionError) as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]

        async def at(when_s: float) -> None:
            delay = t0 + when_s * scale - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)

        async def session(turns: list[tuple[int, TraceRequest]]) -> None:
            sizes: list[int] = []
            for k, (i, req) in enumerate(turns):
                await at(req.at)
                if k and req.gap:
                    await asyncio.sleep(req.gap * scale)
                await one(i, req, list(sizes))
                sizes.append(req.prompt_tokens)

        async def single(i: int, req: TraceRequest) -> None:
            await at(req.at)
            await one(i, req, [])

        sessions: dict[str, list[tuple[int, TraceRequest]]] = {}
        tasks = []
        for i, req in enumerate(requests):
            if req.session is None:
                tasks.append(single(i, req))
            else:
                sessions.setdefault(req.session, []).append((i, req))
        tasks += [session(turns) for turns in sessions.values()]
        await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    return {"requests": [r for r in results if r is not None], "wallS": round(wall, 3),
            "spanS": round(wall / scale, 3)}


async def main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            return
        try:
            result = await replay(json.loads(line))
        except Exception as exc:  # noqa: BLE001 - the driver gets the reason, not a dead pipe
            result = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
