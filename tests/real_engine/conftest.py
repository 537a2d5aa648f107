"""Fixtures for the real-engine tests: the generated model and llama-server processes.

The binary comes from ``scripts/build_llama_server.py`` (or ``HUBPOOL_LLAMA_SERVER``).
Without it these tests skip, saying how to build it — except under CI (``CI=true``),
where .ci/run builds it first, so its absence is a failure rather than a quiet skip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from real_engine.support import LlamaServer, require_llama_server, write_tiny_gguf


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """The llama-server binary, or a skip (a failure under CI) naming where it was looked for."""
    return require_llama_server()


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated model (~0.5 MB), written once per session."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


@pytest.fixture
def start_llama(llama_server_binary: Path, tiny_gguf: Path, tmp_path: Path) -> Iterator[Callable[..., LlamaServer]]:
    """A factory: ``start_llama(slots=2, ctx=2048)`` starts a llama-server on the tiny model
    and returns it ready; every one started is stopped when the test ends."""
    started: list[LlamaServer] = []

    def start(**kwargs) -> LlamaServer:
        server = LlamaServer(llama_server_binary, tiny_gguf, log_dir=tmp_path, **kwargs).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
