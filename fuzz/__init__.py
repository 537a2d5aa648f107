"""atheris fuzz targets for the parsers that read bytes from peers, engines and operators.

``uv run python -m fuzz <target> --seconds N`` runs one target under atheris (libFuzzer) for N
seconds, seeded from the committed corpus in ``fuzz/corpus/<target>/``; ``--seconds 0`` only
replays that corpus. ``tests/security/test_fuzz_corpora.py`` replays every corpus in CI.
"""
