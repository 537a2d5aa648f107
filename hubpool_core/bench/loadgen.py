"""The relay benchmark's load generator: a separate process, so its CPU is never the
relay's.

It stays up for the whole benchmark (a fresh interpreter per run would cost more CPU than
most runs measure) and answers one JSON line on stdout for each JSON line of work on stdin:

``{"url": ..., "body": {...}, "c": 16, "n": 400, "deadline_s": 60, "capture": false}``

``c`` workers share one aiohttp session per target (keep-alive, as an app's SDK does) and
issue ``n`` requests in all, closed-loop. Time to first byte is the first body chunk, not
the headers. With ``capture`` the raw body of the first answer is returned (base64) for
the byte-transparency check. With ``sign`` (``{"pkcs8", "uuid", "fqdn", "recipient", "path"}``)
every request carries a fresh peer signature, made here as a paired node's own client would:
the load is then signed forwards to ``/local/*``, each with a new nonce.

Run: ``python -m hubpool_core.bench.loadgen`` (driven by :mod:`hubpool_core.bench.relay`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import resource
import sys
import time
from typing import Any

import aiohttp

from hubpool_core.bench.stub_engine import run_fast
from hubpool_core.peering.signing import sign_headers, signing_key_from_pkcs8


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of an already sorted list, or None when empty."""
    if not sorted_values:
        return None
    rank = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[rank]


class LoadGen:
    """Sessions kept per target across runs, so every run after the first is warm."""

    def __init__(self) -> None:
        self.sessions: dict[str, aiohttp.ClientSession] = {}

    def session(self, url: str) -> aiohttp.ClientSession:
        base = url.split("/", 3)[2]
        if base not in self.sessions:
            self.sessions[base] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120),
                auto_decompress=False)
        return self.sessions[base]

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """One closed-loop run; the figures in milliseconds."""
        url, c, n = job["url"], int(job["c"]), int(job["n"])
        payload = json.dumps(job["body"]).encode()
        headers = {"Content-Type": "application/json", **job.get("headers", {})}
        session = self.session(url)
        deadline = time.perf_counter() + float(job.get("deadline_s", 120))
        issued = 0
        rows: list[tuple[float, float, bool]] = []
        errors: list[str] = []
        captured: list[bytes] = []
        served_by: set[str] = set()
        statuses: dict[str, int] = {}
        signer = job.get("sign")
        key = signing_key_from_pkcs8(signer["pkcs8"]) if signer else None

        def request_headers() -> dict[str, str]:
            if not signer:
                return headers
            return {**headers, **sign_headers(key, "POST", signer["path"], signer["uuid"], signer["fqdn"],
                                              signer["recipient"], None)}

        async def worker() -> None:
            nonlocal issued
            while issued < n and time.perf_counter() < deadline:
                issued += 1
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=payload, headers=request_headers()) as resp:
                        first = await resp.content.readany()
                        t1 = time.perf_counter()
                        parts = [first]
                        while True:
                            chunk = await resp.content.readany()
                            if not chunk:
                                break
                            parts.append(chunk)
                        t2 = time.perf_counter()
                        if resp.status != 200:
                            statuses[str(resp.status)] = statuses.get(str(resp.status), 0) + 1
                            if len(errors) < 5:
                                errors.append(f"HTTP {resp.status}: {b''.join(parts)[:200]!r}")
                            rows.append((t1 - t0, t2 - t0, False))
                            continue
                        if job.get("capture") and not captured:
                            captured.append(b"".join(parts))
                        backend = resp.headers.get("x-hub-pool-served-by")
                        if backend:
                            served_by.add(backend)
                        rows.append((t1 - t0, t2 - t0, True))
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    if len(errors) < 5:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    rows.append((0.0, time.perf_counter() - t0, False))

        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        wall = time.perf_counter() - started
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        good = [r for r in rows if r[2]]
        ttfb = sorted(r[0] * 1000 for r in good)
        total = sorted(r[1] * 1000 for r in good)
        out: dict[str, Any] = {
            "done": len(rows), "ok": len(good), "failed": len(rows) - len(good), "errors": errors,
            "wall_s": round(wall, 4), "rps": round(len(good) / wall, 2) if wall > 0 else 0.0,
            "servedBy": sorted(served_by), "statuses": statuses,
            "client_cpu_s": round(usage1.ru_utime - usage0.ru_utime + usage1.ru_stime - usage0.ru_stime, 4),
        }
        for name, values in (("ttfb", ttfb), ("total", total)):
            for q in (50, 90, 99):
                value = percentile(values, q)
                out[f"{name}_p{q}"] = None if value is None else round(value, 4)
        if captured:
            out["body_b64"] = base64.b64encode(captured[0]).decode()
        return out

    async def close(self) -> None:
        for session in self.sessions.values():
            await session.close()


async def _serve_stdin() -> None:
    gen = LoadGen()
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            line = line.strip()
            if not line:
                continue
            try:
                result = await gen.run(json.loads(line))
            except Exception as exc:  # noqa: BLE001 - the driver reads the error, never a trace
                result = {"error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
    finally:
        await gen.close()


def main() -> None:
    """Serve jobs from stdin until it closes."""
    run_fast(_serve_stdin())


if __name__ == "__main__":
    main()
