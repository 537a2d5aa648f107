"""Alembic environment: runs against the engine the Database hands over."""

from alembic import context

from hubpool_core.store.models import metadata

config = context.config
engine = config.attributes["connection_engine"]

with engine.begin() as connection:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
