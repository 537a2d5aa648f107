"""The proxy: carry one placed request to its candidates and the answer back to the app.

- ``relay.py``: the failover walk, one upstream attempt, verdicts, and the stream pump.
- ``output_check.py``: judging a 200 that may not be an answer.
- ``translate.py``: native (NDJSON) requests served by an OpenAI-only engine.

The rest of the core uses only the names below.
"""

from hubpool_core.proxy.relay import LOCAL_PREFIX, Budgets, RelayPlan, RelayResponse, ReuseAwareConnector

__all__ = ["LOCAL_PREFIX", "Budgets", "RelayPlan", "RelayResponse", "ReuseAwareConnector"]
