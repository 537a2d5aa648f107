"""A CLI verb that writes a setting the node's environment overrides says so, as `hubpool
enable` does for a kill switch (issue 26, item 21): on main `hubpool ceiling 4096` printed
"Prompt ceiling: 4096" while HUB_POOL_MAX_PROMPT_TOKENS=8192 stayed in force. Through a running
node and the real command (typer's runner, in this process)."""

from __future__ import annotations

import json

from harness import RunningNode
from typer.testing import CliRunner

from hubpool_core.cli.commands import app

P = "/api/inference/pool"
ENV = {"HUB_POOL_MAX_PROMPT_TOKENS": "8192", "HUB_POOL_DEV_HEALTH_POLL_SECONDS": "5",
       "HUB_POOL_INBOUND_DISABLED": "true"}


def hubpool(node: RunningNode, *args: str):
    env = {"HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
           "COLUMNS": "300"}
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def test_every_verb_that_writes_an_overridden_setting_warns(tmp_path):
    with RunningNode(tmp_path / "n", ENV) as n:
        r = hubpool(n, "ceiling", "4096")
        assert r.exit_code == 0, r.output
        assert "Prompt ceiling: 4096" in r.stdout
        assert ("warning: HUB_POOL_MAX_PROMPT_TOKENS=8192 in this node's environment overrides poolMaxPromptTokens: "
                "the new value is saved, but nothing changed in what this node does.") in r.stdout, r.stdout
        assert "Remove that variable from the node's environment" in r.stdout
        with n.client(headers=n.headers()) as c:
            status = c.get(P + "/status").json()
        assert status["settings"]["poolMaxPromptTokens"] == 4096  # saved ...
        assert status["localNode"]["maxPromptTokens"] == 8192  # ... and the environment's in force
        assert status["environmentOverrides"] == {
            "poolMaxPromptTokens": {"variable": "HUB_POOL_MAX_PROMPT_TOKENS", "value": 8192},
            "poolHealthPollSeconds": {"variable": "HUB_POOL_DEV_HEALTH_POLL_SECONDS", "value": 5},
            "poolInboundEnabled": {"variable": "HUB_POOL_INBOUND_DISABLED", "value": "true"}}

        # `hubpool settings`: the JSON on stdout as before, the warning beside it
        r = hubpool(n, "settings", "poolHealthPollSeconds=60", "poolLocalAffinity=2")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["poolHealthPollSeconds"] == 60
        assert "HUB_POOL_DEV_HEALTH_POLL_SECONDS=5 in this node's environment overrides poolHealthPollSeconds" \
            in r.stderr, r.stderr
        assert "poolLocalAffinity" not in r.stderr  # nothing overrides that one
        r = hubpool(n, "settings", "poolInboundEnabled=true")
        assert "HUB_POOL_INBOUND_DISABLED=true in this node's environment overrides poolInboundEnabled" in r.stderr

        # `hubpool enable` already said so; it still does
        r = hubpool(n, "enable", "--inbound", "--yes")
        assert "HUB_POOL_INBOUND_DISABLED=true in this node's environment keeps inbound pooling off" in r.stdout

        # and status names them all
        r = hubpool(n, "status")
        assert ("Environment   HUB_POOL_INBOUND_DISABLED=true over poolInboundEnabled · HUB_POOL_MAX_PROMPT_TOKENS=8192 "
                "over poolMaxPromptTokens · HUB_POOL_DEV_HEALTH_POLL_SECONDS=5 over poolHealthPollSeconds") in r.stdout


def test_no_warning_when_the_setting_is_in_force(tmp_path):
    with RunningNode(tmp_path / "n") as n:
        r = hubpool(n, "ceiling", "4096")
        assert r.exit_code == 0 and r.stdout.strip() == "Prompt ceiling: 4096", r.output
        r = hubpool(n, "settings", "poolHealthPollSeconds=60")
        assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr
        with n.client(headers=n.headers()) as c:
            assert c.get(P + "/status").json()["environmentOverrides"] == {}
