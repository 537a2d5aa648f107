"""The hubpool-sim command: flags, config files, the listening line, and a clean exit."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from hubpool_sim.cli import build_parser, config_from_args, main


def parse(*argv: str):
    return config_from_args(build_parser().parse_args(list(argv)))


def test_defaults():
    cfg = parse()
    assert cfg.flavor == "ollama" and cfg.slots == 4
    assert [(m.id, m.window, m.embedding) for m in cfg.models] == [("llama3.2:3b", 8192, False), ("nomic-embed-text", 2048, True)]


def test_flags_build_the_config():
    cfg = parse("--flavor", "llamacpp", "--model", "qwen3:8b:32768", "--model", "bge-embed-small", "--slots", "2",
                "--prefill-tps", "500", "--decode-tps", "40", "--timings", "--api-key", "k",
                "--fault", "drop", "--fault", "verdict:no-user-query@qwen3:8b:1")
    assert cfg.flavor == "llamacpp" and cfg.slots == 2 and cfg.timings and cfg.api_key == "k"
    assert [(m.id, m.window, m.embedding) for m in cfg.models] == [("qwen3:8b", 32768, False), ("bge-embed-small", 8192, True)]
    assert cfg.prefill_tps == 500 and cfg.token_delay_s == pytest.approx(0.025)
    assert [str(f) for f in cfg.faults] == ["drop", "verdict:no-user-query@qwen3:8b:1"]


def test_config_file_then_flags(tmp_path):
    toml = tmp_path / "sim.toml"
    toml.write_text('flavor = "vllm"\nslots = 8\nfaults = ["cut@:1"]\n[[models]]\nid = "qwen3:8b"\nwindow = 4096\n')
    cfg = parse("--config", str(toml), "--slots", "3")
    assert cfg.flavor == "vllm" and cfg.slots == 3 and cfg.models[0].window == 4096 and cfg.faults == ["cut@:1"]
    js = tmp_path / "sim.json"
    js.write_text(json.dumps({"flavor": "omlx", "models": ["m:1024"]}))
    assert parse("--config", str(js)).models[0].window == 1024


def test_bad_input_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--fault", "explode"])
    assert exited.value.code == 2 and "unknown fault" in capsys.readouterr().err


def test_help_describes_faults():
    result = subprocess.run([sys.executable, "-m", "hubpool_sim.cli", "--help"], capture_output=True, text=True, timeout=20)
    assert result.returncode == 0
    for word in ("--flavor", "--fault SPEC", "verdict:", "drop", "default ports"):
        assert word in result.stdout


def test_runs_prints_where_and_stops_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "hubpool_sim.cli", "--flavor", "vllm", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("hubpool-sim: vllm engine listening on http://127.0.0.1:")
        url = line.split(" on ", 1)[1].split()[0]
        assert httpx.get(url + "/health").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_port_in_use_says_so():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "hubpool_sim.cli", "--port", str(port)],
                                capture_output=True, text=True, timeout=20)
    assert result.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in result.stderr
