import json
import os
import time
from types import SimpleNamespace

from hubpool_host_file.source import MAX_AGE_S, HostFilePressure
from hypothesis import given
from hypothesis import strategies as st


def _source(tmp_path, body):
    path = tmp_path / "gpu.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return HostFilePressure(SimpleNamespace(pressure_host_file=str(path))), path


def test_reads_busy_percent_as_a_fraction(tmp_path):
    source, _ = _source(tmp_path, {"busyPercent": 95})
    assert source.read() == 0.95


def test_missing_stale_or_malformed_is_none(tmp_path):
    assert HostFilePressure(SimpleNamespace(pressure_host_file=str(tmp_path / "none.json"))).read() is None
    for bad in ("not json", [], {"busyPercent": "95"}, {"busyPercent": -1}, {"busyPercent": 101},
                {"busyPercent": True}, {}, '{"busyPercent": NaN}'):
        assert _source(tmp_path, bad)[0].read() is None, bad
    source, path = _source(tmp_path, {"busyPercent": 50})
    old = time.time() - MAX_AGE_S - 5
    os.utime(path, (old, old))
    assert source.read() is None


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=5)))
def test_read_is_none_or_a_fraction(value):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "gpu.json"
        path.write_text(json.dumps({"busyPercent": value}))
        got = HostFilePressure(SimpleNamespace(pressure_host_file=str(path))).read()
    assert got is None or 0.0 <= got <= 1.0
