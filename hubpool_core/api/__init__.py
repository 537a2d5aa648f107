"""The HTTP routers: each translates requests to calls on the rooms below and answers back.

- ``inference.py``: app-facing routes of both dialects (``/v1/*``, ``/api/*``), at the root
  and under ``/api/inference/pool/``; listings and ``/api/show``.
- ``local.py``: peer-facing ``/local/*``, work a paired node forwards to this node's engines.
- ``peers.py``: the pairing handshake (``/pair/*``, ``/capabilities``) and the operator's
  pairing routes.
- ``operator.py``: settings, status, routing log, plugins, and the unauthenticated identify.
- ``advice.py``: inference preferences, the client handout, and doctor.
- ``metrics_route.py``: ``GET /metrics``.
- ``edge.py``: bodies of callers not yet authenticated, read only up to a limit.
- ``admission.py``: the pool-wide admission queue (``poolAdmissionQueue``): waiting requests,
  their order, and the 429/503 answers.
"""
