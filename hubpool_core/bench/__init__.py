"""Benchmarks of what hubpool adds: a stub engine, a load generator and the orchestration
behind ``hubpool bench relay`` and ``hubpool bench capacity``.

- ``relay.py``: ``hubpool bench relay`` (what one hop and two add, the CI gate).
- ``capacity.py``: ``hubpool bench capacity`` (concurrent streams before TTFT suffers).
- ``stub_engine.py``: a minimal fast OpenAI-style engine; ``loadgen.py``: the load
  generator, a separate process; ``procs.py``: starting and measuring the processes.

Nothing here runs in a serving node; the package is imported only by the bench commands.
"""
