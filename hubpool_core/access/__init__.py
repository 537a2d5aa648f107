"""Who may call what, for the app-facing and operator routes.

- ``guards.py``: the inference guard (origin or inference key) and operator authentication.
- ``credentials.py``: the operator key and the API keys, stored hashed.

Peers are admitted elsewhere (``hubpool_core.peering.guard``): by signature, never by key.
"""
