"""Engine and migrations. SQLite runs in WAL mode so readers never block the writer."""

from __future__ import annotations

import ast
import errno
import logging
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine as SqlEngine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, InterfaceError, OperationalError

from hubpool_core.config import parse_decimal, refuse_once

log = logging.getLogger("hubpool.store")

MIGRATIONS = Path(__file__).parent / "migrations"

#: what a database that cannot be reached raises (a refused or dropped connection, a server
#: shutting down); anything else is a bug or bad data, not an outage
UNREACHABLE = (OperationalError, InterfaceError)

#: how long to wait for a PostgreSQL connection: a server that is gone must not hold a request
#: (or the health tick) longer than this
CONNECT_TIMEOUT_S = 3


def redacted(url: str) -> str:
    """The URL with any password masked, for logs and /status."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(unparseable database URL)"


class DatabaseUrlError(ValueError):
    """A database URL no engine can be built from (a typo, an unknown scheme, a driver that is
    not installed): said as a sentence naming the variable it came from, never a traceback."""

    def __init__(self, url: str, exc: BaseException, setting: str = "HUB_POOL_DATABASE_URL"):
        shown = redacted(url)
        if shown == "(unparseable database URL)":  # said as given, any password still masked
            shown = re.sub(r"://[^@/]*@", "://***@", url)[:200]
        what = "`sqlite` (history.db in the data directory), " if setting == "HUB_POOL_HISTORY" else ""
        driver = " (PostgreSQL needs the postgres extra: pip install 'hubpool[postgres]')" \
            if isinstance(exc, ImportError) and url.startswith("postgres") else ""
        super().__init__(
            f"{setting}={shown} is not a database URL hubpool can open ({describe(exc)}){driver}: give "
            f"{what}sqlite:////absolute/path.db or postgresql+psycopg://user@host/database (docs/postgres.md)")
        self.setting = setting


def describe(exc: BaseException) -> str:
    """One line an operator can read: the driver's first line, not SQLAlchemy's background link."""
    inner = getattr(exc, "orig", None) or exc
    first = (str(inner).strip().splitlines() or [type(inner).__name__])[0]
    return f"{type(inner).__name__}: {first}"[:300]


class Database:
    """One database: its engine (repos run Core statements on ``engine.begin()`` / ``connect()``)."""

    def __init__(self, url: str, setting: str = "HUB_POOL_DATABASE_URL"):
        self.url = url
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            # the busy timeout: how long a write waits for another writer (a CLI command on the
            # same database, the node's own thread) before it says "busy"
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": busy_timeout_s()}
        elif url.startswith("postgresql"):
            # a pooled connection the server dropped (a restart) is found and replaced before
            # use, and a server that is gone fails a connect in seconds, not minutes
            kwargs["pool_pre_ping"] = True
            kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
        try:
            self.engine: SqlEngine = create_engine(url, future=True, **kwargs)
        except (ArgumentError, ImportError) as exc:  # NoSuchModuleError is an ArgumentError
            raise DatabaseUrlError(url, exc, setting) from None
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        #: wall-clock time the database stopped answering, None while it answers
        self.down_since: float | None = None
        self.last_error: str | None = None
        #: the schema has not been brought up to date yet (the database was down at start)
        self.migration_pending = False

    # -- reachability: what a node does while its database is down ---------------------------

    @property
    def available(self) -> bool:
        """False from the first failed connection until a probe (the health tick, in a
        thread) reaches the database again: the request path never waits on a dead server
        meanwhile, it reads what the node holds in memory."""
        return self.down_since is None

    def mark_down(self, exc: BaseException) -> None:
        """Record that the database cannot be reached. A full disk or a lock held past the
        busy timeout raises the same driver error but is no outage: the database answers, the
        one write is refused (storage_refusal says how), and nothing is marked."""
        if storage_refusal(exc) is not None:
            return
        first = self.down_since is None
        self.last_error = describe(exc)
        if first:
            self.down_since = time.time()
            log.error("database unreachable at %s (%s): routing goes on with the peers held in memory; "
                      "changes that need the database answer 503 database_unavailable until it is back",
                      redacted(self.url), self.last_error)

    def mark_up(self) -> None:
        if self.down_since is not None:
            log.warning("database reachable again at %s after %.0f s", redacted(self.url),
                        time.time() - self.down_since)
        self.down_since = None
        self.last_error = None

    def probe(self) -> bool:
        """One round trip (and the migration a down-at-start node still owes); records the
        answer. True when the database answers."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            if self.migration_pending:
                self.migrate()
                self.migration_pending = False
        except UNREACHABLE as exc:
            self.mark_down(exc)
            return False
        self.mark_up()
        return True

    def status(self) -> dict[str, Any]:
        """The /status view: which backend, where, and whether it answers."""
        return {
            "backend": self.engine.dialect.name,
            "url": redacted(self.url),
            "available": self.available,
            "downSince": (datetime.fromtimestamp(self.down_since, UTC).isoformat().replace("+00:00", "Z")
                          if self.down_since is not None else None),
            "error": self.last_error,
            "migrationPending": self.migration_pending,
        }

    def migrate(self) -> None:
        """Bring the schema to the newest revision (alembic upgrade head).

        alembic (about 10 MB resident once imported, with mako) is loaded only when the schema
        is behind: a plain query of alembic_version against the newest revision file decides."""
        current = self.current_revision()
        if current == head_revision():
            return
        refuse_newer_schema(current, self.url)
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["connection_engine"] = self.engine
        command.upgrade(cfg, "head")

    def current_revision(self) -> str | None:
        """The schema revision alembic recorded here, or None (new database, or no single one)."""
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(text("SELECT version_num FROM alembic_version")).fetchall()
        except Exception:  # noqa: BLE001 - no table yet (or unreadable): the migration decides
            return None
        return rows[0][0] if len(rows) == 1 else None

    def dispose(self) -> None:
        self.engine.dispose()


#: the child that migrates for a long-running process: the URL comes in the environment (a
#: database password never shows in the process list)
_MIGRATE_CHILD = (
    "import os, sys\n"
    "from hubpool_core.store.db import Database\n"
    "db = Database(os.environ['HUB_POOL_MIGRATE_URL'])\n"
    "db.migrate()\n"
    "db.dispose()\n"
)


def migrate_apart(url: str, timeout_s: float = 300) -> bool:
    """Bring the schema at ``url`` to the newest revision in a short-lived child process.

    For the long-running node (`hubpool serve`): alembic and mako stay resident once
    imported (about 12 MB, docs/performance.md G7), and a node only needs them the first time
    it meets a database. True when the schema is at the newest revision afterwards; False
    when the child failed or cannot see the same database (SQLite in memory), in which case
    the node's own :meth:`Database.migrate` runs it in-process and reports any error itself."""
    if url.startswith("sqlite") and (":memory:" in url or url.rstrip("/") in ("sqlite:", "sqlite+pysqlite:")
                                     or "mode=memory" in url):
        return False
    db = Database(url)
    try:
        current = db.current_revision()
        if current == head_revision():
            return True
        if current is not None and current not in known_revisions():
            return False  # a newer schema: the node's own migrate() refuses it with the reason
    finally:
        db.dispose()
    env = dict(os.environ, HUB_POOL_MIGRATE_URL=url)
    try:
        done = subprocess.run([sys.executable, "-P", "-c", _MIGRATE_CHILD], env=env, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("schema migration in a child process did not run (%s); migrating in-process", exc)
        return False
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        log.info("schema migration in a child process failed (%s); migrating in-process", tail[0])
        return False
    return True


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer hubpool than this one: a downgrade, refused."""


def refuse_newer_schema(current: str | None, url: str) -> None:
    """Raise :class:`SchemaTooNew` when ``current`` is a revision this release does not know.

    Going back a release must not touch a schema a newer one wrote (its tables may hold what
    this one cannot read, and alembic cannot downgrade from a revision it has no file for)."""
    if current is None or current in known_revisions():
        return
    raise SchemaTooNew(
        f"The database at {redacted(url)} is at schema revision {current}, written by a newer hubpool than "
        f"this one (which knows revisions up to {head_revision()}). hubpool never downgrades a schema: "
        "install the newer release again, or point HUB_POOL_DATABASE_URL (or HUB_POOL_HISTORY) at a "
        "database of this release's own (docs/upgrades.md).")


def known_revisions() -> set[str]:
    """Every revision among this release's migration files."""
    return set(_revision_graph() or {})


def _revision_graph() -> dict[str, object] | None:
    revisions: dict[str, object] = {}
    for path in (MIGRATIONS / "versions").glob("*.py"):
        values: dict[str, object] = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id in ("revision", "down_revision"):
                try:
                    values[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    return None
        if isinstance(revision := values.get("revision"), str):
            revisions[revision] = values.get("down_revision")
    return revisions


def head_revision() -> str | None:
    """The newest revision among the migration files: the one no other revision follows.

    Read from each file's `revision` / `down_revision` assignments without importing alembic;
    None when that is not one clear head (alembic then decides)."""
    revisions = _revision_graph()
    if revisions is None:
        return None
    followed: set[object] = set()
    for down in revisions.values():
        followed.update(down if isinstance(down, (tuple, list)) else [down])
    heads = [r for r in revisions if r not in followed]
    return heads[0] if len(heads) == 1 else None


#: HUB_POOL_SQLITE_BUSY_TIMEOUT_S: seconds a write waits for the database's write lock (1-600)
DEFAULT_BUSY_TIMEOUT_S = 30.0


def busy_timeout_s() -> float:
    raw = os.environ.get("HUB_POOL_SQLITE_BUSY_TIMEOUT_S")
    value = parse_decimal(raw)
    if value is None:
        if raw is not None and raw.strip():
            refuse_once("HUB_POOL_SQLITE_BUSY_TIMEOUT_S", raw, "a number of seconds from 1 to 600")
        return DEFAULT_BUSY_TIMEOUT_S
    return min(600.0, max(1.0, value))


class StorageRefused(Exception):
    """A write this node could not make: its disk is full (507) or its database stayed locked by
    another writer past the busy timeout (503, worth retrying). Nothing was half-written: the
    database rolled the transaction back, a file write never replaced the file it was for."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


FULL_MESSAGE = ("This node's data directory is out of space ({where}): the change was not saved and nothing "
                "was half-written. Free space on that disk (df -h {where}), then retry.")
BUSY_MESSAGE = ("This node's database stayed locked by another writer (another hubpool command, or a second "
                "process on the same data directory) for {timeout:.0f} s: the change was not saved. Retry; if it "
                "keeps happening, look for a stuck hubpool process (HUB_POOL_SQLITE_BUSY_TIMEOUT_S waits longer).")


def storage_refusal(exc: BaseException, where: str | os.PathLike[str] | None = None) -> StorageRefused | None:
    """What a failed write means for the operator, or None when it is not a storage condition:
    ENOSPC/EDQUOT from a file write, SQLITE_FULL, or SQLITE_BUSY/LOCKED past the busy timeout."""
    place = str(where) if where else "the data directory"
    if isinstance(exc, StorageRefused):
        return exc
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageRefused(507, FULL_MESSAGE.format(where=place))
    text = str(getattr(exc, "orig", None) or exc).lower()
    if type(exc).__name__ == "OperationalError" or type(getattr(exc, "orig", None)).__name__ == "OperationalError":
        if "disk is full" in text:
            return StorageRefused(507, FULL_MESSAGE.format(where=place))
        if "database is locked" in text or "database is busy" in text or "database table is locked" in text:
            return StorageRefused(503, BUSY_MESSAGE.format(timeout=busy_timeout_s()))
    return None


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 - DB-API connection
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()
