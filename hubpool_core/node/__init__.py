"""A running node: the composition root that builds every room and serves them.

- ``node.py``: :class:`~hubpool_core.node.node.Node`, everything one ``hubpool serve``
  process holds, built once at start.
- ``app.py``: the ASGI application (routers, the routed fast path).
- ``server.py``: running it under uvicorn.
- ``directions.py``: the kill switches, resolved in one place.
- ``heap_trim.py``: giving freed heap back after bursts.
- ``doctor.py``: ``hubpool doctor``'s checks.

Only the outer rooms (``api/``, ``web/``, ``cli/``, ``bench/``) import from here
(ARCHITECTURE.md, the code map).
"""
