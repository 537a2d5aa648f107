"""Durable state: identity, peers and API keys, in SQLite by default or any SQLAlchemy URL."""

from hubpool_core.store.db import Database
from hubpool_core.store.models import ApiKey, Base, PoolIdentity, PoolPeer

__all__ = ["ApiKey", "Base", "Database", "PoolIdentity", "PoolPeer"]
