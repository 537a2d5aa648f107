"""One strict parser for every number an operator gives (issue 26, item 9): environment
variables, query parameters and CLI numbers take ASCII digits only (no ``--5``, no ``²``, no
``٣``); a refused environment value is logged once and ignored (the default applies), a refused
query parameter is a 400 sentence, a refused CLI number a sentence; a mistyped HUB_POOL_HISTORY
or HUB_POOL_DATABASE_URL is a sentence, never an SQLAlchemy traceback. Through running nodes
(and a pair of them for the capabilities probe), the real CLI and real `hubpool serve`."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

import httpx
import pytest
from harness import RunningNode, make_pool, name_of, pair, wait_until
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from hubpool_core import config
from hubpool_core.cli.commands import app
from hubpool_core.config import EnvSettings, parse_decimal, parse_whole

P = "/api/inference/pool"
BAD = ("--2048", "²", "٣٠٠٠", "１２", "12.5k", "0x10", "1e3", " ", "+5")


@pytest.fixture(autouse=True)
def _fresh_refusals(monkeypatch):
    """Each test sees its own "said once" memory (it is per process)."""
    monkeypatch.setattr(config, "_REFUSED", set())


def hubpool(*args: str, env: dict[str, str]):
    """The real command in this process (typer's runner): an unhandled exception fails the test."""
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **env}, catch_exceptions=False)


def _cli(data, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUB_POOL_")}
    env.update({"HUB_POOL_DATA_DIR": str(data), "COLUMNS": "200", "HUB_POOL_TAILSCALE_CLI": "/nonexistent/tailscale",
                **extra})
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


# -- the parser itself ------------------------------------------------------------------------

@given(st.integers(min_value=-10**17, max_value=10**17))
def test_every_whole_number_reads_back(n):
    assert parse_whole(str(n)) == n and parse_whole(f"  {n}\n") == n


@given(st.text(max_size=30))
def test_nothing_but_ascii_digits_after_one_minus_is_a_number(text):
    value = parse_whole(text)  # never raises, whatever the text
    body = text.strip()
    digits = body[1:] if body.startswith("-") else body
    accepted = bool(digits) and len(digits) <= 18 and all(c in "0123456789" for c in digits)
    assert (value is not None) == accepted
    if accepted:
        assert value == int(body)


@pytest.mark.parametrize("raw", BAD)
def test_the_spellings_int_and_isdigit_let_through_are_refused(raw):
    assert parse_whole(raw) is None and parse_decimal(raw) is None


def test_decimals_take_a_fraction_and_nothing_else():
    assert parse_decimal("1.5") == 1.5 and parse_decimal("30") == 30.0
    for raw in ("nan", "inf", "1e3", "١.٥", ".5", "1.", "--1"):
        assert parse_decimal(raw) is None, raw


def test_the_placement_stages_read_their_per_request_numbers_by_the_same_rule():
    from hubpool_stages.affinity import ttl_ms_from
    from hubpool_stages.throughput import slower_settings

    assert ttl_ms_from({"HUB_POOL_PREFIX_AFFINITY_TTL_MS": "٣٠٠٠"}) == 600_000  # main read it as 3000
    assert ttl_ms_from({"HUB_POOL_PREFIX_AFFINITY_TTL_MS": "3000"}) == 3000
    assert slower_settings({"HUB_POOL_SLOWER_PLACEMENT_RATIO": "٥", "HUB_POOL_SLOWER_PLACEMENT_FLOOR_MS": "1e3"}) \
        == (3.0, 20000.0)
    assert slower_settings({"HUB_POOL_SLOWER_PLACEMENT_RATIO": "5", "HUB_POOL_SLOWER_PLACEMENT_FLOOR_MS": "1000"}) \
        == (5.0, 1000.0)


# -- the environment, through running nodes ---------------------------------------------------

@pytest.mark.parametrize("bad", ["--5", "²"])
def test_a_malformed_number_at_start_is_logged_once_and_the_node_serves_with_defaults(tmp_path, caplog, bad):
    """On main, `--5` in any of these stopped the node at start with a traceback (int('--5')),
    and `²` in HUB_POOL_MAX_PROMPT_TOKENS made /status answer 500."""
    env = {var: bad for var in ("HUB_POOL_ROUTING_LOG_SIZE", "HUB_POOL_FIRST_BYTE_TIMEOUT_MS",
                                "HUB_POOL_HISTORY_FLUSH_MS", "HUB_POOL_COMPLETION_TIMEOUT_MS",
                                "HUB_POOL_MIN_PREFILL_TOKENS_PER_SEC", "HUB_POOL_MAX_PROMPT_TOKENS",
                                "HUB_POOL_DEV_CLOCK_OFFSET_MS", "HUB_POOL_MAX_BODY_BYTES")}
    env.update({"HUB_POOL_HISTORY": "sqlite", "HUB_POOL_HISTORY_RETENTION_DAYS": "٣"})
    with caplog.at_level(logging.WARNING, logger="hubpool"):
        with RunningNode(tmp_path / "n", env) as n, n.client(headers=n.headers()) as c:
            r = c.get(P + "/status")
            assert r.status_code == 200, r.text
            status = r.json()
            assert status["localNode"]["maxPromptTokens"] is None and status["localNode"]["maxPromptTokensSetBy"] is None
            assert status["routing"]["capacity"] == 200  # the default ring
            assert status["history"]["flushMs"] == 2000 and status["history"]["retentionDays"] == 30
            assert n.node.budgets.connect_ms == 300_000 and n.node.env.max_body_bytes == 32 * 1024 * 1024
            EnvSettings.from_environ(n.environ)  # read again (as the CLI does): not said again
    said = [r.getMessage() for r in caplog.records if r.name == "hubpool.config"]
    for var in env:
        if var not in ("HUB_POOL_HISTORY", "HUB_POOL_HISTORY_RETENTION_DAYS"):
            assert sum(m.startswith(f"{var}=") for m in said) == 1, (var, said)
    prompt = next(m for m in said if m.startswith("HUB_POOL_MAX_PROMPT_TOKENS="))
    assert "ignored rather than guessed at" in prompt and "1024 to 1048576" in prompt
    assert any("HUB_POOL_HISTORY_RETENTION_DAYS" in r.getMessage() for r in caplog.records)


def test_a_peer_with_a_malformed_ceiling_still_answers_its_capabilities_probe(tmp_path):
    """On main, HUB_POOL_MAX_PROMPT_TOKENS=--2048 made /capabilities answer 500, so every peer
    struck the node."""
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": {"HUB_POOL_MAX_PROMPT_TOKENS": "--2048"}})
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    try:
        pair(a, b)
        a.run(a.node.health.poll_once())
        with a.client(headers=a.headers()) as c:
            peer = next(p for p in c.get(P + "/status").json()["peers"] if p["nodeFqdn"] == name_of(b))
        assert peer["status"] == "connected" and peer["probeFailure"] is None, peer
        assert peer["consecutiveFailures"] == 0
    finally:
        a.stop()
        b.stop()


def test_a_malformed_dev_health_poll_does_not_stop_the_health_loop(tmp_path):
    """On main, HUB_POOL_DEV_HEALTH_POLL_SECONDS=--5 raised from the loop's interval after the
    first tick: no poll ever again (nor the 24 h expiry and PIN sweep that ride it)."""
    (tmp_path / "hub-a").mkdir()
    (tmp_path / "hub-a" / "settings.json").write_text('{"poolHealthPollSeconds": 10}')
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-a": {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "--5"}})
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    try:
        assert a.node.health.poll_s == 10  # the refused value is ignored: the setting applies
        pair(a, b)
        a.run(a.node.health.poll_once())
        with a.client(headers=a.headers()) as c:
            def seen() -> str | None:
                return next(p["lastSeenAt"] for p in c.get(P + "/status").json()["peers"]
                            if p["nodeFqdn"] == name_of(b))

            first = seen()
            assert first is not None
            # the loop's own next tick (none driven by the test) polls the peer again
            assert wait_until(lambda: seen() != first, timeout=40, interval=0.2), "no health poll after the first tick"
        task = a.node.health._loop._task
        assert task is not None and not task.done()
    finally:
        a.stop()
        b.stop()


# -- query parameters ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["²", "--5", "٣", "0x10"])
def test_a_malformed_limit_is_a_400_sentence(tmp_path, value):
    with RunningNode(tmp_path / "n", {"HUB_POOL_HISTORY": "sqlite"}) as n, n.client(headers=n.headers()) as c:
        for path, top in (("/routing-log", 10_000), ("/routing-history", 10_000)):
            r = c.get(P + path, params={"limit": value})
            assert r.status_code == 400, (path, r.status_code, r.text)
            assert r.json()["error"] == f"limit must be a whole number from 1 to {top}"
        r = c.get(P + "/handout", params={"minContext": value})
        assert r.status_code == 400 and "whole number" in r.json()["error"], r.text
        assert c.get(P + "/routing-log", params={"limit": "5"}).status_code == 200


# -- CLI numbers ------------------------------------------------------------------------------

def test_cli_numbers_are_sentences_never_tracebacks(tmp_path):
    with RunningNode(tmp_path / "n") as n:
        env = {"HUB_POOL_DATA_DIR": str(tmp_path / "n"), "HUB_POOL_LISTEN": f"127.0.0.1:{n.port}"}
        for verb in ("ceiling", "context-cap", "slots"):
            r = hubpool(verb, "²", env=env)
            assert r.exit_code == 1 and "takes a whole number or `clear`" in r.stderr, (verb, r.stderr)
        for args in (("log", "--limit", "²"), ("log", "--limit", "--5"), ("handout", "--min-context", "٣")):
            r = hubpool(*args, env=env)
            assert r.exit_code == 2 and "is not a whole number" in r.stderr, (args, r.stderr)
        r = hubpool("ceiling", "4096", env=env)
        assert r.exit_code == 0 and "Prompt ceiling: 4096" in r.stdout, r.stderr


# -- database URLs --------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_mistyped_database_url_is_a_sentence_at_start_and_in_the_cli(tmp_path):
    for url, shown in (("postgres ://hub:s3cret@db/hubpool", "postgres ://***@db/hubpool"),
                       ("postgres://hub:s3cret@db/hubpool", "postgres://hub:***@db/hubpool")):
        r = _cli(tmp_path, "serve", HUB_POOL_DATABASE_URL=url, HUB_POOL_LISTEN=f"127.0.0.1:{_free_port()}")
        assert r.returncode == 1, (url, r.stderr[-2000:])
        assert f"HUB_POOL_DATABASE_URL={shown} is not a database URL hubpool can open" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "s3cret" not in r.stderr, r.stderr
    r = _cli(tmp_path, "api-key", "list", HUB_POOL_DATABASE_URL="sqlte")
    assert r.returncode == 1 and "HUB_POOL_DATABASE_URL=sqlte is not a database URL" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_mistyped_history_setting_leaves_history_off_and_says_why(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUB_POOL_")}
    env.update({"HUB_POOL_DATA_DIR": str(tmp_path / "n"), "HUB_POOL_LISTEN": f"127.0.0.1:{port}",
                "HUB_POOL_TAILSCALE_CLI": "/nonexistent/tailscale", "HUB_POOL_HISTORY": "sqlte",
                "OLLAMA_URL": "http://127.0.0.1:9"})
    proc = subprocess.Popen([sys.executable, "-m", "hubpool_core.cli", "serve"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}{P}/identify", timeout=2, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None
        assert wait_until(answers, timeout=60, interval=0.2)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        r = _cli(tmp_path / "n", "status", HUB_POOL_LISTEN=f"127.0.0.1:{port}")
        assert r.returncode == 0, r.stderr
        assert "History       off — HUB_POOL_HISTORY=sqlte is not a database URL hubpool can open" in r.stdout
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert "routing history stays off: HUB_POOL_HISTORY=sqlte" in err and "Traceback" not in err, err[-3000:]
