"""The nonce cache across restarts: what one process of a node hands the next.

A restart used to empty the cache, so a request accepted just before it could be replayed
until its window closed; the fix refused every signature timestamped before the start, which
locked a peer whose clock lags by *d* seconds out for *d* seconds after every restart, read as
"credentials refused" and backed off for up to 15 minutes (docs/reliability.md, restarts).

Now the node writes ``peer-nonces.json`` in its data directory:

- on a clean shutdown, after the server stopped taking requests: every live nonce, per
  sender, marked ``clean``. The next process loads them and judges every signature exactly as
  the last one would have: no watermark at all, so no peer is refused, however its clock runs.
- at start and on every health tick: only each sender's clock offset (the smallest
  ``receipt − timestamp`` shown by its accepted requests that could still be replayed, over
  their whole 300 s window), marked not clean. A crash leaves this behind. The next
  process then cannot know the nonces spent since, and judges each sender by a watermark of
  its own: ``start − offset``. A request accepted before the crash was signed at most at
  ``receipt − offset`` < ``start − offset``, so its replay is refused; a fresh one from the same
  sender is signed at ``now − offset``, at or after the watermark, so it is accepted at once
  whether that sender's clock lags 30 s or 290 s. A sender with no recorded offset (or no
  file at all, while peers exist) is judged by the start time, the old rule.

A signature under a watermark is answered 503, retryable (signing.Verdict), never the 401 a
health tick reads as a credential failure. Writing the nonces only at shutdown keeps the
forwarding path free of disk writes; the tick's write is a few bytes per peer.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from hubpool_core.peering.signing import NonceCache, clock_ms

log = logging.getLogger("hubpool.nonces")

#: the file's name inside the data directory
NONCE_FILE = "peer-nonces.json"
_VERSION = 1


def nonce_file_path(data_dir: Path) -> Path:
    """Where a data directory keeps the nonce cache between processes."""
    return data_dir / NONCE_FILE


def load_nonce_cache(path: Path, *, peers_exist: bool, clock_offset_ms: int = 0) -> NonceCache:
    """The cache a starting node judges signatures with (see the module docstring).

    ``peers_exist``: whether the node had peer rows at start; a node with none can have
    accepted nothing before, and applies no watermark when there is no clean record."""
    cache = NonceCache(clock=lambda: clock_ms(clock_offset_ms))
    start = clock_ms(clock_offset_ms)
    data = _read(path)
    if data is None:
        if peers_exist:
            cache.not_before_ms = start
            log.info("no record of the nonces spent before this start: signatures made before it are refused "
                     "(retryable) until peers sign anew")
        return cache
    clean = data.get("clean") is True
    raw_senders = data.get("senders")
    senders: dict[Any, Any] = raw_senders if isinstance(raw_senders, dict) else {}
    # a watermark an earlier process still judged by stays in force until its window passes
    cache.not_before_ms = _int(data.get("notBeforeMs"))
    if not clean and peers_exist:
        cache.not_before_ms = start  # a sender the record does not name: the old rule
    restored = 0
    for sender, entry in senders.items():
        if not isinstance(sender, str) or not isinstance(entry, dict):
            continue
        lag, earlier = _int(entry.get("lagMs")), _int(entry.get("notBeforeMs"))
        raw = entry.get("nonces") if clean else None
        nonces = {n: e for n, e in raw.items() if isinstance(n, str) and isinstance(e, int)} \
            if isinstance(raw, dict) else {}
        watermark = earlier
        if not clean:
            own = start - lag if lag is not None else start
            watermark = own if earlier is None else max(own, earlier)
        cache.restore(sender, nonces, lag, watermark, now_ms=start)
        restored += len(nonces)
    if clean:
        log.info("restored %d spent nonces from the last clean shutdown", restored)
    else:
        log.info("the last run did not shut down cleanly: signatures made before this start are judged by each "
                 "peer's recorded clock offset (%d peers)", len(senders))
    return cache


def save_nonce_cache(cache: NonceCache, path: Path, *, clean: bool) -> None:
    """Write the record atomically: with ``clean``, every live nonce (call it only once no
    request can be admitted any more); otherwise each sender's clock offset alone."""
    lags = cache.take_lags()
    senders: dict[str, dict[str, Any]] = {sender: {"lagMs": lag} for sender, lag in lags.items()}
    common, own = cache.watermarks()
    for sender, watermark in own.items():
        senders.setdefault(sender, {"lagMs": None})["notBeforeMs"] = watermark
    if clean:
        for sender, nonces in cache.entries().items():
            senders.setdefault(sender, {"lagMs": None})["nonces"] = nonces
    payload = json.dumps({"version": _VERSION, "clean": clean, "notBeforeMs": common, "senders": senders},
                         separators=(",", ":"))
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(payload)
            if clean:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)  # a full disk leaves no partial record behind
        # not fatal: the next start falls back to the narrow rule, and says so
        log.warning("could not write %s (%s): the next start judges older signatures by the start time", path,
                    exc.strerror or exc)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return None
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return None
    return data
