"""Operator key and API keys.

The operator key is minted once into the data directory (mode 0600) so the CLI on the
same machine can read it. API keys are stored as SHA-256 hashes only; the key itself is
shown once, at creation.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import insert, select, update

from hubpool_core.store import ApiKey, Database, api_key_table
from hubpool_core.store.db import UNREACHABLE
from hubpool_core.store.models import from_row, values_of

log = logging.getLogger("hubpool.access")

OPERATOR_KEY_FILE = "operator.key"
SCOPES = ("operator", "inference", "qa:read")
_PREFIX = {"operator": "hpo_", "inference": "hpi_", "qa:read": "hpq_"}
#: how many resolved keys a process remembers for an outage (a pool has a handful)
SEEN_KEYS_MAX = 1024


def operator_key_path(data_dir: Path) -> Path:
    return data_dir / OPERATOR_KEY_FILE


def ensure_operator_key(data_dir: Path) -> str:
    """Read the operator key, minting it on first start. The file is created 0600 from
    the first byte (O_EXCL), so no other local user can read it even briefly."""
    path = operator_key_path(data_dir)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    data_dir.mkdir(parents=True, exist_ok=True)
    key = _PREFIX["operator"] + secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race: use its key
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key


def read_operator_key(data_dir: Path) -> str | None:
    try:
        return operator_key_path(data_dir).read_text().strip() or None
    except OSError:
        return None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who a credential speaks for: ``scope`` is operator, inference or qa:read."""

    scope: str
    key_id: str | None  # None for the operator key file / HUB_POOL_OPERATOR_KEY


class KeyStore:
    def __init__(self, db: Database, data_dir: Path, env_operator_key: str | None):
        self.db = db
        self.data_dir = data_dir
        self.env_operator_key = env_operator_key or None
        self.operator_key = ensure_operator_key(data_dir)
        #: keys resolved valid by this process (SHA-256 -> principal), for a database outage;
        #: a revocation through this node drops its entry
        self._seen: dict[str, Principal] = {}

    def is_operator_key(self, presented: str) -> bool:
        ok = hmac.compare_digest(presented.encode(), self.operator_key.encode())
        if self.env_operator_key:
            ok = hmac.compare_digest(presented.encode(), self.env_operator_key.encode()) or ok
        return ok

    def resolve(self, presented: str) -> Principal | None:
        """The principal behind a bearer credential, or ``None`` when it is not one of ours."""
        if not presented:
            return None
        if self.is_operator_key(presented):
            return Principal("operator", None)
        digest = hash_key(presented)
        if not self.db.available:
            return self._seen.get(digest)
        try:
            with self.db.engine.connect() as conn:
                row = conn.execute(select(api_key_table.c.id, api_key_table.c.scope, api_key_table.c.revoked_at)
                                   .where(api_key_table.c.key_hash == digest)).first()
        except UNREACHABLE as exc:
            # the database is down: a key this process has already seen valid still works (as
            # routing goes on from the peers in memory); a new one waits for the database
            self.db.mark_down(exc)
            return self._seen.get(digest)
        if row is None or row.revoked_at is not None:
            self._seen.pop(digest, None)
            return None
        try:
            with self.db.engine.begin() as conn:
                conn.execute(update(api_key_table).where(api_key_table.c.id == row.id)
                             .values(last_used_at=datetime.now(UTC)))
        except UNREACHABLE as exc:
            # the "last used" stamp is bookkeeping: a full disk, a database another writer holds or
            # one that just went away must not refuse a valid key (the node keeps serving)
            log.warning("could not record the use of API key %s (%s)", row.id[:8], getattr(exc, "orig", None) or exc)
        principal = Principal(row.scope, row.id)
        if len(self._seen) >= SEEN_KEYS_MAX:
            self._seen.clear()
        self._seen[digest] = principal
        return principal

    def create(self, name: str, scope: str) -> tuple[ApiKey, str]:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
        key = _PREFIX[scope] + secrets.token_urlsafe(32)
        row = ApiKey(name=name, scope=scope, key_hash=hash_key(key), prefix=key[:10])
        with self.db.engine.begin() as conn:
            conn.execute(insert(api_key_table).values(values_of(row)))
        return row, key

    def list(self) -> list[ApiKey]:
        with self.db.engine.connect() as conn:
            return [from_row(ApiKey, r) for r in
                    conn.execute(select(api_key_table).order_by(api_key_table.c.created_at))]

    def revoke(self, ident: str) -> ApiKey | None:
        """Revoke by full id, unique id prefix or name; ``None`` when nothing matches."""
        with self.db.engine.begin() as conn:
            live = conn.execute(select(api_key_table).where(api_key_table.c.revoked_at.is_(None)))
            rows = [
                r for r in (from_row(ApiKey, row) for row in live)
                if r.id == ident or r.name == ident or (len(ident) >= 4 and r.id.startswith(ident))
            ]
            if len(rows) != 1:
                if len(rows) > 1:
                    raise LookupError(f"{ident!r} matches {len(rows)} keys; use the full id")
                return None
            self._seen = {d: p for d, p in self._seen.items() if p.key_id != rows[0].id}
            rows[0].revoked_at = datetime.now(UTC)
            conn.execute(update(api_key_table).where(api_key_table.c.id == rows[0].id)
                         .values(revoked_at=rows[0].revoked_at))
            return rows[0]


def public_key_row(row: ApiKey) -> dict:
    return {
        "id": row.id,
        "name": row.name,
        "scope": row.scope,
        "prefix": row.prefix,
        "createdAt": _iso(row.created_at),
        "lastUsedAt": _iso(row.last_used_at),
        "revokedAt": _iso(row.revoked_at),
    }


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
