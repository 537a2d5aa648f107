"""Who may call what, for the app-facing and operator routes.

- ``guards.py``: the inference guard (origin or inference key) and operator authentication.
- ``credentials.py``: the operator key (a file in the data directory) and the API keys (kept
  only as hashes).
- ``sessions.py``: the web UI's cookie sessions (signed in with the operator key) and CSRF.

Peers are admitted elsewhere (``hubpool_core.peering.guard``): by signature, never by key.
"""
