"""What the node tells the operator about the work it did.

- ``routing_log.py``: the bounded in-memory ring of routing decisions, with cursors
  (never a prompt).
- ``metrics.py``: the Prometheus series behind ``GET /metrics``.
- ``tracing.py``: optional OpenTelemetry traces, off unless ``OTEL_TRACES_EXPORTER`` asks.
- ``charts.py``: routing-log rows folded into the Hub Pool page's per-minute series.
- ``annotations.py``: the ↳ notes that explain a row to a person (``hubpool log``, the web UI).
"""
