"""Every fuzz target over its committed corpus (fuzz/corpus/<target>/): fast, in CI.

The corpora hold the seeds and every input a fuzzing run found a defect with; the long,
time-boxed runs are ``uv run python -m fuzz all --seconds 60`` (see fuzz/run.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.run import NAMES
from fuzz.targets import TARGETS

CORPUS = Path(__file__).resolve().parents[2] / "fuzz" / "corpus"


def test_every_target_has_a_corpus_and_the_runner_names_them_all():
    assert set(NAMES) == set(TARGETS)
    for name in TARGETS:
        assert len(list((CORPUS / name).iterdir())) >= 5, name


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_target_over_its_corpus(name):
    for path in sorted((CORPUS / name).iterdir()):
        TARGETS[name](path.read_bytes())  # a target raises only on a defect
