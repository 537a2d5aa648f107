"""The peer list's cache (peering/peers.py): a one-row update patches the cached list in place
instead of dropping it, so the health tick's update of every peer no longer makes every
inbound peer call re-read every row (the mesh's idle cost grew with the square of the pool,
docs/performance.md). The patched list must be exactly what a fresh read returns, and a write
that races the patch must still drop it."""

from __future__ import annotations

from sqlalchemy import event

from hubpool_core.peering.peers import PeerRepo
from hubpool_core.store import Database, PoolPeer


def _repo(tmp_path, n: int = 5) -> PeerRepo:
    db = Database(f"sqlite:///{tmp_path / 'peers.db'}")
    db.migrate()
    repo = PeerRepo(db)
    for i in range(n):
        repo.add(PoolPeer(node_fqdn=f"node-{i}.example.ts.net", direction="outbound", status="connected"))
    return repo


def _count_selects(repo: PeerRepo) -> list[str]:
    seen: list[str] = []
    event.listen(repo.db.engine, "before_cursor_execute",
                 lambda _c, _cur, statement, *_a: seen.append(statement) if statement.lstrip().upper()
                 .startswith("SELECT") else None)
    return seen


def test_an_update_patches_the_cached_list_and_matches_a_fresh_read(tmp_path):
    repo = _repo(tmp_path)
    rows = repo.all()
    selects = _count_selects(repo)
    for i, row in enumerate(rows):
        fresh = repo.update(row.id, consecutive_failures=0, last_capabilities={"backends": [], "tick": i})
        assert fresh is not None and fresh.last_capabilities["tick"] == i
    after_writes = len(selects)  # each update reads its own row back once
    cached = repo.all()
    assert len(selects) == after_writes, "the list was served from the patched cache, not re-read"
    repo._all = None  # noqa: SLF001 - force the fresh read to compare with
    fresh = repo.all()
    assert [(r.id, r.node_fqdn, r.last_capabilities, r.updated_at) for r in cached] == \
           [(r.id, r.node_fqdn, r.last_capabilities, r.updated_at) for r in fresh]


def test_a_rename_or_a_racing_write_drops_the_cache(tmp_path):
    repo = _repo(tmp_path, 3)
    rows = repo.all()
    repo.update(rows[0].id, node_fqdn="zz-renamed.example.ts.net")  # the list's order changes
    assert repo._all is None  # noqa: SLF001
    assert [r.node_fqdn for r in repo.all()][-1] == "zz-renamed.example.ts.net"
    # a write between the cache read and the patch (housekeeping from its thread) wins
    real_one = repo.update.__globals__["_one"]

    def racing(conn, where):  # noqa: ANN001, ANN202
        row = real_one(conn, where)
        repo._generation += 2  # noqa: SLF001 - what another write's _writing() does meanwhile
        return row

    repo.update.__globals__["_one"] = racing
    try:
        repo.update(rows[1].id, consecutive_failures=1)
    finally:
        repo.update.__globals__["_one"] = real_one
    assert repo._all is None, "a racing write leaves no patched list"  # noqa: SLF001
    assert {r.id: r.consecutive_failures for r in repo.all()}[rows[1].id] == 1
