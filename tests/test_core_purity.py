"""The core names no engine and imports no plugin; every hook is documented."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hubpool_core import hookspecs

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "hubpool_core"
ENGINE_NAMES = re.compile(r"ollama|vllm|llama\.?cpp|llama-server|lemonade|omlx", re.IGNORECASE)
#: wire names the spec fixes that happen to contain an engine's name; the core must speak them
SPEC_FIELD_NAMES = {"ollamaSlots", "inferenceOllamaSlots", "OLLAMA_HOST"}


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                ids.add(id(body[0].value))
    return ids


def test_core_imports_no_plugin_package():
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not (name.startswith("hubpool_") and not name.startswith("hubpool_core")), \
                    f"{path.relative_to(ROOT)} imports plugin package {name}"


def test_core_names_no_engine_outside_docstrings():
    offenders = []
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = _docstring_nodes(tree)
        for node in ast.walk(tree):
            text = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value
            elif isinstance(node, ast.Name):
                text = node.id
            elif isinstance(node, ast.Attribute):
                text = node.attr
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                text = node.name
            elif isinstance(node, ast.arg):
                text = node.arg
            if text and text not in SPEC_FIELD_NAMES and ENGINE_NAMES.search(text):
                offenders.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}: {text[:60]!r}")
    assert not offenders, "engine names in the core:\n" + "\n".join(offenders)


def test_the_purity_check_would_catch_a_violation():
    tree = ast.parse('KIND = "vllm"\n')
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.Constant))
    assert ENGINE_NAMES.search(node.value) and id(node) not in _docstring_nodes(tree)


def test_every_hook_has_a_section_in_docs_hooks_md():
    doc = (ROOT / "docs" / "hooks.md").read_text()
    hooks = [name for name in dir(hookspecs) if name.startswith("hubpool_")]
    assert hooks
    missing = [h for h in hooks if not re.search(rf"^##+ .*`{h}\(", doc, re.MULTILINE)]
    assert not missing, f"hooks without a section in docs/hooks.md: {missing}"


def test_every_hook_has_a_docstring():
    for name in dir(hookspecs):
        if name.startswith("hubpool_"):
            assert (getattr(hookspecs, name).__doc__ or "").strip(), name
