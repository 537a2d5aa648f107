#!/usr/bin/env bash
# The store's tests against real PostgreSQL: starts a throwaway cluster on loopback from
# Debian's `postgresql` binaries (apt-get install -y postgresql), exports
# HUBPOOL_TEST_POSTGRES_URL so the `store_url` fixture runs each store, pairing, identity,
# API-key and migration test against it as well as SQLite, and stops it afterwards.
# Extra arguments go to pytest (e.g. -x -q, or other test paths).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  echo "PostgreSQL's server binaries are missing: apt-get install -y postgresql" >&2
  exit 2
fi
pg_root=$(mktemp -d /tmp/hubpool-pg-XXXXXX)
trap 'uv run python tests/pg_cluster.py stop "$pg_root" || true; rm -rf "$pg_root"' EXIT
eval "$(uv run python tests/pg_cluster.py start "$pg_root")"
export HUBPOOL_TEST_POSTGRES_URL
echo "PostgreSQL at ${HUBPOOL_TEST_POSTGRES_URL}" >&2
uv run pytest tests/test_identity.py tests/test_access.py tests/test_pairing.py tests/test_upgrade.py \
  tests/test_postgres_outage.py tests/test_history.py "$@"
