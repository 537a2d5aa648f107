"""Benchmarks of what hubpool adds: a stub engine, a load generator and the orchestration
behind ``hubpool bench relay`` and ``hubpool bench capacity``.

Nothing here runs in a serving node; the package is imported only by the bench commands.
"""
