"""The test lanes: what ``-m "not slow"`` (CONTRIBUTING.md, the fast lane) leaves out.

Slow is decided by path, from measured durations on a 2-core machine: whole-process and
browser suites, and the end-to-end files that take many seconds each. The full suite
(``uv run pytest``, what CI runs) still runs everything.
"""

from __future__ import annotations

import pytest

#: paths (relative to the repository root) whose tests are slow
SLOW = (
    "tests/fault/",
    "tests/web/",
    "tests/real_engine/",
    "tests/security/test_api_fuzz.py",
    "tests/test_chaos.py",
    "tests/test_bench_relay.py",
    "tests/test_bench_capacity.py",
    "tests/test_serve.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        try:
            rel = item.path.relative_to(root).as_posix()
        except ValueError:
            continue
        if rel.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
