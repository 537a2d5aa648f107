"""Engine, sessions and migrations. SQLite runs in WAL mode so readers never block the writer."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine as SqlEngine
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("hubpool.store")

MIGRATIONS = Path(__file__).parent / "migrations"


class Database:
    def __init__(self, url: str):
        self.url = url
        kwargs = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        self.engine: SqlEngine = create_engine(url, future=True, **kwargs)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False, class_=Session)

    def migrate(self) -> None:
        """Bring the schema to the newest revision (alembic upgrade head)."""
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["connection_engine"] = self.engine
        command.upgrade(cfg, "head")

    def session(self) -> Session:
        return self.sessions()

    def dispose(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 - DB-API connection
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()
