"""ARCHITECTURE.md's code map is true: every room it names exists, every package is named,
and no module imports a room its room may not."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "hubpool_core"
TOP = "top"
HEADING = re.compile(r"^### `hubpool_core/(?:([a-z_]+)/)?`", re.MULTILINE)
MAY_IMPORT = re.compile(r"^May import: (.*?)(?:\n\n|\Z)", re.MULTILINE | re.DOTALL)


def code_map(text: str) -> dict[str, set[str]]:
    """room -> the rooms it may import, from the map's headings and their "May import" lines."""
    rooms: dict[str, set[str]] = {}
    headings = list(HEADING.finditer(text))
    for at, heading in enumerate(headings):
        end = headings[at + 1].start() if at + 1 < len(headings) else len(text)
        section = text[heading.end():end]
        allowed = MAY_IMPORT.search(section)
        assert allowed, f"the code map's section for {heading.group(0)} has no 'May import:' line"
        names = set(re.findall(r"`([a-z_]+)`", allowed.group(1)))
        rooms[heading.group(1) or TOP] = names
    return rooms


def packages() -> set[str]:
    return {p.parent.name for p in CORE.glob("*/__init__.py")}


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and (CORE / parts[1] / "__init__.py").exists():
        return parts[1]
    return TOP


def imported_rooms(path: Path) -> set[str]:
    """Every room a module imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "hubpool_core":  # `from hubpool_core import x`: x may be a room
                names += [f"hubpool_core.{a.name}" for a in node.names]
        else:
            continue
        found |= {room_of(n) for n in names if n == "hubpool_core" or n.startswith("hubpool_core.")}
    return found


def violations(rooms: dict[str, set[str]]) -> list[str]:
    out = []
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        mine = room_of(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for other in sorted(imported_rooms(path) - {mine, TOP} - rooms.get(mine, set())):
            out.append(f"{rel} (room {mine}) imports {other}")
        if mine == TOP and imported_rooms(path) - {TOP}:
            out.append(f"{rel} (the top level) imports {sorted(imported_rooms(path) - {TOP})}")
    return out


def test_every_package_is_in_the_code_map_and_every_room_in_it_exists():
    rooms = code_map((ROOT / "ARCHITECTURE.md").read_text())
    named = set(rooms) - {TOP}
    assert packages() - named == set(), "packages the code map does not name"
    assert named - packages() == set(), "rooms the code map names that do not exist"


def test_every_room_names_only_rooms_that_exist():
    rooms = code_map((ROOT / "ARCHITECTURE.md").read_text())
    for room, allowed in rooms.items():
        assert allowed - set(rooms) == set(), f"{room} may import unknown rooms"


def test_no_module_imports_a_room_its_room_may_not():
    rooms = code_map((ROOT / "ARCHITECTURE.md").read_text())
    assert violations(rooms) == []


def test_every_plugin_is_in_the_code_map():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    plugins = {p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists()}
    assert plugins
    missing = {name for name in plugins if f"`{name}`" not in text}
    assert missing == set()


def test_only_the_plugin_host_calls_hooks():
    """Nothing on the request path goes through a hook: only plugins.py touches pluggy's
    hook caller (``manager.hook``)."""
    offenders = []
    for path in CORE.rglob("*.py"):
        if path == CORE / "plugins.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "hook":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_the_map_check_would_catch_a_missing_room_and_a_forbidden_import():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    rooms = code_map(text)
    assert {"placement", "proxy", "peering"} <= set(rooms)
    without_peering = {room: allowed - {"peering"} for room, allowed in rooms.items()}
    assert any("imports peering" in v for v in violations(without_peering))
    shrunk = code_map(text.replace("### `hubpool_core/proxy/`", "### proxy (unnamed)"))
    assert "proxy" in packages() - set(shrunk)
