"""The AMD sysfs busy-percent source, on fake sysfs trees."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pluggy
from hubpool_amd_drm import AmdDrmPressure
from hubpool_amd_drm.source import parse_percent
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core import PressureSource, hookspecs


def card(root: Path, name: str, content: str | bytes | None) -> Path:
    """Make ``root/name/device`` and, unless ``content`` is None, its busy file."""
    device = root / name / "device"
    device.mkdir(parents=True, exist_ok=True)
    if content is not None:
        path = device / "gpu_busy_percent"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return device


def source(root: Path) -> AmdDrmPressure:
    return AmdDrmPressure(SimpleNamespace(amd_drm_root=str(root)))


def test_identity():
    assert issubclass(AmdDrmPressure, PressureSource)
    assert AmdDrmPressure.name == "amd_drm"
    assert AmdDrmPressure.order == 200
    assert AmdDrmPressure(SimpleNamespace()).root == Path("/sys/class/drm")


def test_two_cards_the_busiest_wins(tmp_path):
    card(tmp_path, "card0", "12\n")
    card(tmp_path, "card1", "87\n")
    assert source(tmp_path).read() == 0.87
    text = source(tmp_path).describe()
    assert "card0/device/gpu_busy_percent (12%)" in text
    assert "card1/device/gpu_busy_percent (87%)" in text
    assert "busiest card is at 87%" in text


def test_bounds(tmp_path):
    card(tmp_path, "card0", "0\n")
    assert source(tmp_path).read() == 0.0
    card(tmp_path, "card0", "100\n")
    assert source(tmp_path).read() == 1.0


def test_connectors_render_nodes_and_non_amd_cards_are_ignored(tmp_path):
    card(tmp_path, "card0", "40\n")
    card(tmp_path, "card0-DP-1", "99\n")  # a connector: never a GPU counter
    card(tmp_path, "renderD128", "99\n")
    card(tmp_path, "card1", None)  # e.g. an NVIDIA card: no busy file
    (tmp_path / "version").write_text("drm 1.1.0 20060810\n")
    assert source(tmp_path).read() == 0.40


def test_junk_contents_read_as_unmeasured(tmp_path):
    for junk in ("", "busy\n", "-1\n", "101\n", "37.5\n", "0x20\n", b"\xff\xfe", "1e2"):
        card(tmp_path, "card0", junk)
        assert source(tmp_path).read() is None, junk
    assert "not a percentage" in source(tmp_path).describe()


def test_a_junk_card_does_not_hide_a_good_one(tmp_path):
    card(tmp_path, "card0", "garbage")
    card(tmp_path, "card1", "25\n")
    assert source(tmp_path).read() == 0.25
    text = source(tmp_path).describe()
    assert "25%" in text and "card0/device/gpu_busy_percent holds" in text


def test_no_cards_is_unmeasured(tmp_path):
    assert source(tmp_path).read() is None
    assert "lists no card* devices" in source(tmp_path).describe()
    card(tmp_path, "card0", None)
    assert source(tmp_path).read() is None
    assert "have no gpu_busy_percent" in source(tmp_path).describe()


def test_missing_root_is_unmeasured(tmp_path):
    s = source(tmp_path / "nope")
    assert s.read() is None
    assert "does not exist here" in s.describe()


def test_a_root_that_is_a_file_is_unmeasured(tmp_path):
    f = tmp_path / "drm"
    f.write_text("x")
    assert source(f).read() is None
    assert isinstance(source(f).describe(), str)


def test_unreadable_file_is_unmeasured(tmp_path):
    # a directory where the file should be: open() fails with IsADirectoryError
    (card(tmp_path, "card0", None) / "gpu_busy_percent").mkdir()
    assert source(tmp_path).read() is None
    assert "could not be read" in source(tmp_path).describe()


def test_dangling_device_link_is_named(tmp_path):
    (tmp_path / "card0").mkdir()
    os.symlink(tmp_path / "devices" / "pci0000:00" / "gone", tmp_path / "card0" / "device")
    assert source(tmp_path).read() is None
    assert "dangling link" in source(tmp_path).describe()


def test_symlinked_device_like_real_sysfs(tmp_path):
    real = tmp_path / "devices" / "pci0000:00" / "0000:03:00.0"
    real.mkdir(parents=True)
    (real / "gpu_busy_percent").write_text("64\n")
    drm = tmp_path / "class" / "drm"
    (drm / "card1").mkdir(parents=True)
    os.symlink(real, drm / "card1" / "device")
    assert source(drm).read() == 0.64


def test_parse_percent():
    assert parse_percent(b"37\n") == 37
    assert parse_percent(b"  5 ") == 5
    assert parse_percent(b"100") == 100
    assert parse_percent(b"1000") is None
    assert parse_percent(b"+5") is None
    assert parse_percent("٣".encode()) is None  # a non-ASCII digit


names = st.one_of(
    st.from_regex(r"card[0-9]{1,2}", fullmatch=True),
    st.from_regex(r"card[0-9]-(DP|HDMI-A|eDP)-[0-9]", fullmatch=True),
    st.sampled_from(["renderD128", "version", "ttm"]),
)
contents = st.one_of(
    st.none(),
    st.integers(min_value=-1000, max_value=1000).map(lambda n: f"{n}\n".encode()),
    st.binary(max_size=40),
    st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")),
)


@settings(max_examples=150, deadline=None)
@given(tree=st.dictionaries(names, contents, max_size=6))
def test_read_is_always_none_or_a_fraction(tree):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, content in tree.items():
            card(root, name, content)
        value = source(root).read()
        assert value is None or (isinstance(value, float) and 0.0 <= value <= 1.0)
        expected = [
            int(c.decode().strip())
            for n, c in tree.items()
            if n.startswith("card") and "-" not in n and c is not None and parse_percent(c) is not None
        ]
        assert value == (max(expected) / 100 if expected else None)
        assert isinstance(source(root).describe(), str)


def test_registers_through_the_hook():
    import hubpool_amd_drm

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(hubpool_amd_drm)
    got: list[type] = []
    pm.hook.hubpool_register_pressure_sources(register=got.append)
    assert got == [AmdDrmPressure]
