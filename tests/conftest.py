"""Shared fixtures: simulated engines and real nodes on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness import RunningNode

from hubpool_sim import SimConfig, SimModel, run_in_thread


@pytest.fixture
def ollama_sim() -> Iterator:
    cfg = SimConfig(flavor="ollama", models=[SimModel("llama3.2:3b", window=8192),
                                             SimModel("nomic-embed-text", window=2048, embedding=True)])
    with run_in_thread(cfg) as sim:
        yield sim


@pytest.fixture
def vllm_sim() -> Iterator:
    cfg = SimConfig(flavor="vllm", models=[SimModel("qwen3:8b", window=16384),
                                           SimModel("bge-small", window=512, embedding=True)])
    with run_in_thread(cfg) as sim:
        yield sim


@pytest.fixture
def node(tmp_path, ollama_sim, vllm_sim) -> Iterator[RunningNode]:
    """A node whose own engines are a simulated Ollama and a simulated vLLM."""
    with RunningNode(tmp_path / "node", {"OLLAMA_URL": ollama_sim.url, "VLLM_URL": vllm_sim.url}) as n:
        yield n
