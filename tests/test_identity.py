"""Pool identity: minted once, sealed at rest, never re-minted (spec "Failure modes"; §2e, §3)."""

from __future__ import annotations

import os
import re
import stat
import threading

import pytest
from sqlalchemy import select

from hubpool_core.peering.identity import (
    IDENTITY_RETRY_S,
    IdentityStore,
    Keypair,
    node_secret_path,
    open_sealed_key,
    seal_private_key,
)
from hubpool_core.peering.signing import (
    NonceCache,
    public_key_fingerprint,
    sign_headers,
    verify_headers,
    verify_key_from_spki,
)
from hubpool_core.store import Database, PoolIdentity, identity_table

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db(store_url):
    database = Database(store_url("hubpool"))
    database.migrate()
    yield database
    database.dispose()


def row(db: Database) -> PoolIdentity | None:
    with db.engine.connect() as conn:
        found = conn.execute(select(identity_table)).one_or_none()
    return PoolIdentity(**found._mapping) if found is not None else None


def test_nothing_is_minted_until_first_use(db, tmp_path):
    IdentityStore(db, node_secret_path(tmp_path))
    assert row(db) is None
    assert not node_secret_path(tmp_path).exists()


def test_mint_persist_reload(db, tmp_path):
    store = IdentityStore(db, node_secret_path(tmp_path))
    first = store.get()
    assert isinstance(first, Keypair) and first.can_sign and store.error is None
    assert UUID_RE.fullmatch(first.node_uuid)
    assert verify_key_from_spki(first.public_key) == first.signing_key.verify_key
    assert store.get() is first  # memoised

    stored = row(db)
    assert (stored.id, stored.node_uuid, stored.public_key, stored.algorithm) == ("self", first.node_uuid, first.public_key, "ed25519")
    assert stored.private_key_encrypted.startswith("v1:")
    assert "MC4CAQAw" not in stored.private_key_encrypted  # no PKCS8 in the clear
    assert stored.rotated_at is None

    again = IdentityStore(db, node_secret_path(tmp_path)).get()  # a restart
    assert (again.node_uuid, again.public_key) == (first.node_uuid, first.public_key)
    assert bytes(again.signing_key) == bytes(first.signing_key)


def test_node_secret_file_is_private_and_32_bytes(db, tmp_path):
    path = tmp_path / "data" / "node.secret"
    IdentityStore(db, path).get()
    assert len(path.read_bytes()) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_fingerprint(db, tmp_path):
    store = IdentityStore(db, node_secret_path(tmp_path))
    assert re.fullmatch(r"([0-9a-f]{2}:){7}[0-9a-f]{2}", store.fingerprint())
    assert store.fingerprint() == public_key_fingerprint(store.get().public_key)


def test_rotate_keeps_the_uuid_and_replaces_the_keys(db, tmp_path):
    store = IdentityStore(db, node_secret_path(tmp_path))
    before = store.get()
    after = store.rotate()
    assert after.node_uuid == before.node_uuid
    assert after.public_key != before.public_key and after.can_sign
    assert store.get() is after
    stored = row(db)
    assert stored.public_key == after.public_key and stored.rotated_at is not None
    reloaded = IdentityStore(db, node_secret_path(tmp_path)).get()
    assert (reloaded.node_uuid, reloaded.public_key) == (after.node_uuid, after.public_key)


def test_rotate_without_an_identity_refuses(db, tmp_path):
    with pytest.raises(LookupError):
        IdentityStore(db, node_secret_path(tmp_path)).rotate()


def test_changed_node_secret_degrades_to_verify_only_and_never_remints(db, tmp_path):
    secret = node_secret_path(tmp_path)
    original = IdentityStore(db, secret).get()
    before = row(db)

    secret.write_bytes(os.urandom(32))  # the data directory was recreated over a kept database
    store = IdentityStore(db, secret)
    degraded = store.get()

    assert degraded is not None and degraded.signing_key is None and not degraded.can_sign
    assert (degraded.node_uuid, degraded.public_key) == (original.node_uuid, original.public_key)
    assert store.error.startswith("stored pool private key could not be decrypted (node secret changed?): ")
    after = row(db)
    assert (after.node_uuid, after.public_key, after.private_key_encrypted) == (
        before.node_uuid, before.public_key, before.private_key_encrypted)
    assert store.get() is degraded  # memoised: no retry loop against an unrecoverable seal
    assert store.fingerprint() == public_key_fingerprint(original.public_key)
    with pytest.raises(ValueError):
        sign_headers(degraded, "GET", "/api/inference/pool/capabilities", degraded.node_uuid, "a.ts.net", "peer", None)


def test_a_degraded_node_can_still_verify_its_peers(db, tmp_path, store_url):
    secret = node_secret_path(tmp_path)
    own_uuid = IdentityStore(db, secret).get().node_uuid
    secret.write_bytes(os.urandom(32))
    me = IdentityStore(db, secret).get()
    assert me.signing_key is None

    peer = IdentityStore(Database(store_url("peer")), tmp_path / "peer.secret")
    peer.db.migrate()
    them = peer.get()
    path = "/api/inference/pool/capabilities"
    headers = sign_headers(them, "GET", path, them.node_uuid, "peer.example.ts.net", own_uuid, None, now_ms=5)
    verdict = verify_headers(headers, "GET", path, None, sender_public_key_b64=them.public_key,
                             recipient_uuid=me.node_uuid, nonces=NonceCache(), now_ms=5)
    assert verdict.ok


def test_missing_node_secret_with_an_existing_row_is_not_a_remint(db, tmp_path):
    secret = node_secret_path(tmp_path)
    original = IdentityStore(db, secret).get()
    secret.unlink()
    store = IdentityStore(db, secret)
    degraded = store.get()
    assert degraded.signing_key is None and degraded.node_uuid == original.node_uuid
    assert "is missing" in store.error
    assert not secret.exists()  # a lost secret is reported, not papered over


def test_rotate_recovers_a_degraded_node_under_the_current_secret(db, tmp_path):
    secret = node_secret_path(tmp_path)
    original = IdentityStore(db, secret).get()
    secret.write_bytes(os.urandom(32))
    store = IdentityStore(db, secret)
    assert store.get().signing_key is None

    recovered = store.rotate()
    assert recovered.can_sign and recovered.node_uuid == original.node_uuid and store.error is None
    reloaded = IdentityStore(db, secret).get()
    assert reloaded.can_sign and reloaded.public_key == recovered.public_key


def test_a_failed_load_returns_none_and_retries_after_60_s(tmp_path, store_url):
    database = Database(store_url("late"))  # schema not migrated yet
    clock = Clock()
    store = IdentityStore(database, node_secret_path(tmp_path), clock=clock)

    assert store.get() is None
    assert store.error and store.error.startswith("pool identity unavailable: ")
    database.migrate()
    clock.now += IDENTITY_RETRY_S - 0.001
    assert store.get() is None  # still inside the retry window: the store is not touched
    clock.now += 0.001
    identity = store.get()
    assert identity is not None and identity.can_sign and store.error is None


def test_seal_is_bound_to_the_secret_and_the_uuid():
    secret = os.urandom(32)
    sealed = seal_private_key(secret, "uuid-a", "MC4CAQAw")
    assert open_sealed_key(secret, "uuid-a", sealed) == "MC4CAQAw"
    assert sealed != seal_private_key(secret, "uuid-a", "MC4CAQAw")  # random nonce per seal
    from nacl.exceptions import CryptoError

    with pytest.raises(CryptoError):
        open_sealed_key(secret, "uuid-b", sealed)
    with pytest.raises(CryptoError):
        open_sealed_key(os.urandom(32), "uuid-a", sealed)
    with pytest.raises(ValueError):
        open_sealed_key(secret, "uuid-a", "v0:" + sealed[3:])


def test_concurrent_first_use_mints_once(tmp_path, store_url):
    database = Database(store_url("race"))
    database.migrate()
    secret = node_secret_path(tmp_path)
    stores = [IdentityStore(database, secret) for _ in range(6)]  # six "processes"
    results: list[Keypair | None] = [None] * len(stores)
    barrier = threading.Barrier(len(stores))

    def load(i: int) -> None:
        barrier.wait()
        results[i] = stores[i].get()

    threads = [threading.Thread(target=load, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    landed = row(database)
    for result in results:
        assert result is not None
        assert (result.node_uuid, result.public_key) == (landed.node_uuid, landed.public_key)
    database.dispose()


def test_keypair_repr_does_not_leak_the_private_key(db, tmp_path):
    identity = IdentityStore(db, node_secret_path(tmp_path)).get()
    assert "signing_key" not in repr(identity)
