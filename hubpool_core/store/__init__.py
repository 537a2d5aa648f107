"""Durable state: identity, peers and API keys, in SQLite by default or any SQLAlchemy URL.

- ``models.py``: the SQLAlchemy Core tables and the plain row objects read from them.
- ``db.py``: the engine (SQLite in WAL mode) and running the migrations.
- ``migrations/``: alembic's environment and one script per schema version.
"""

from hubpool_core.store.db import Database, StorageRefused, storage_refusal
from hubpool_core.store.models import (
    ApiKey,
    PoolIdentity,
    PoolPeer,
    api_key_table,
    identity_table,
    metadata,
    peer_table,
)

__all__ = ["ApiKey", "Database", "PoolIdentity", "PoolPeer", "StorageRefused", "api_key_table", "identity_table",
           "metadata", "peer_table", "storage_refusal"]
