"""Benchmarks of what hubpool adds: a stub engine, a load generator and the orchestration
behind ``hubpool bench relay``, ``hubpool bench capacity`` and ``hubpool bench pool``.

- ``relay.py``: ``hubpool bench relay`` (what one hop and two add, the CI gate).
- ``capacity.py``: ``hubpool bench capacity`` (concurrent streams before TTFT suffers).
- ``pool.py``: ``hubpool bench pool`` (placement against nginx, LiteLLM and an oracle on
  simulated unequal boxes); ``pool_traces.py`` its traces and file format; ``pool_replay.py``
  the replaying client, ``pool_oracle.py`` the oracle and ``pool_litellm.py`` LiteLLM's
  router, each a separate process.
- ``mesh.py``: ``hubpool bench mesh`` (N nodes paired as a full mesh: pairing, idle CPU and
  memory, placement at N candidates against 2, a node's death and return, a reconciled load).
- ``stub_engine.py``: a minimal fast OpenAI-style engine; ``loadgen.py``: the load
  generator, a separate process; ``procs.py``: starting and measuring the processes.

Nothing here runs in a serving node; the package is imported only by the bench commands.
"""
