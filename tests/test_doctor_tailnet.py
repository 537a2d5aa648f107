"""Doctor's tailnet checks (C1 state, C2 serve, C3 HTTPS certificates) read what the local
daemon says — `tailscale status --json` and `tailscale serve status --json` — through a
running node with recorded answers (issue 16 item 15), so the guide's Check step can read
every check ready (tests/web/test_guide_check.py shows the guide skipping it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness import RunningNode, bound_socket, tailnet_status_for
from typer.testing import CliRunner

from hubpool_core.cli.commands import app

P = "/api/inference/pool"
RECORDED = Path(__file__).resolve().parents[1] / "plugins" / "tailscale_daemon" / "tests" / "data"
ME = "hub-a.example-tailnet.ts.net"


def node_with(tmp_path: Path, status: dict, serve: str | None, port_from_serve: bool = True,
              listen: str | None = None) -> RunningNode:
    """A node whose daemon answers ``status``, and `serve status` with the recorded ``serve``
    file (rewritten to proxy to this node's own port when ``port_from_serve``). ``listen`` is
    its HUB_POOL_LISTEN with ``{port}`` for its port (it is served on loopback either way)."""
    answers = tmp_path / "tailscale"
    answers.mkdir(exist_ok=True)
    (answers / "hub-a.json").write_text(json.dumps(status))
    sock = bound_socket()
    env = {"HUB_POOL_TAILSCALE_CLI": str(answers / "hub-a.json")}
    if listen is not None:
        env["HUB_POOL_LISTEN"] = listen.format(port=sock.getsockname()[1])
    node = RunningNode(tmp_path / "hub-a", env, sock=sock)
    if serve is not None:
        text = (RECORDED / serve).read_text()
        if port_from_serve:
            text = text.replace("127.0.0.1:5002", f"127.0.0.1:{node.port}")
        (answers / "hub-a.serve.json").write_text(text)
    return node


def doctor(node: RunningNode) -> dict[str, dict]:
    with node.client(headers=node.headers()) as c:
        r = c.get(P + "/doctor")
    assert r.status_code == 200, r.text
    return {c["id"]: c for c in r.json()["checks"]}


def running() -> dict:
    return tailnet_status_for("hub-a")


def test_every_tailnet_check_ready_when_the_daemon_says_so(tmp_path):
    with node_with(tmp_path, running(), "serve_status.json") as n:
        checks = doctor(n)
        assert checks["C1"]["verdict"] == "ready" and checks["C1"]["detail"] == ME
        assert checks["C2"]["verdict"] == "ready", checks["C2"]
        assert checks["C2"]["detail"] == f"https://{ME} fronts this node"
        assert checks["C3"]["verdict"] == "ready", checks["C3"]
        assert checks["C3"]["detail"] == f"the tailnet issues a certificate for {ME}"


def test_https_certificates_off_needs_action(tmp_path):
    status = running()
    status.pop("CertDomains")
    with node_with(tmp_path, status, "serve_status.json") as n:
        c3 = doctor(n)["C3"]
        assert c3["verdict"] == "needs action"
        assert "HTTPS is off" in c3["detail"] and "admin console" in c3["fix"]


def test_serve_not_configured_needs_action_with_the_command(tmp_path):
    with node_with(tmp_path, running(), "serve_status_empty.json") as n:
        c2 = doctor(n)["C2"]
        assert c2["verdict"] == "needs action"
        assert c2["detail"].startswith(f"`tailscale serve` publishes nothing at https://{ME}/")
        assert c2["fix"] == f"tailscale serve --bg --https=443 http://127.0.0.1:{n.port}"


@pytest.mark.parametrize(("listen", "target"), [
    ("0.0.0.0:{port}", "http://127.0.0.1:{port}"),
    ("[::]:{port}", "http://127.0.0.1:{port}"),
    ("[::1]:{port}", "http://[::1]:{port}"),
    ("{port}", "http://127.0.0.1:{port}"),
], ids=["ipv4-wildcard", "ipv6-wildcard", "ipv6-loopback", "bare-port"])
def test_the_serve_fix_maps_the_listen_address_as_the_service_line_does(tmp_path, listen, target):
    """Issue 26 item 24: on main C2's fix was built from the raw HUB_POOL_LISTEN
    (`http://0.0.0.0:5002`, `http://:::5002`), which `tailscale serve` cannot proxy to."""
    with node_with(tmp_path, running(), "serve_status_empty.json", listen=listen) as n:
        c2 = doctor(n)["C2"]
        listen_value = listen.format(port=n.port)
    assert c2["fix"] == f"tailscale serve --bg --https=443 {target.format(port=n.port)}", c2
    # the very line `hubpool service install` prints for the same address
    r = CliRunner().invoke(app, ["service", "install", "--user", "--dry-run", "--platform", "linux", "--exec",
                                 sys.executable, "--listen", listen_value],
                           env={"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": "", "XDG_STATE_HOME": ""})
    assert r.exit_code == 0, r.output
    assert f"  {c2['fix']}" in r.stdout.splitlines(), r.stdout


def test_serve_fronting_another_port_needs_action(tmp_path):
    with node_with(tmp_path, running(), "serve_status_other_target.json", port_from_serve=False) as n:
        c2 = doctor(n)["C2"]
        assert c2["verdict"] == "needs action"
        assert f"served by http://127.0.0.1:8080, not by this node (port {n.port})" in c2["detail"]


def test_no_serve_answer_is_a_warning_not_a_guess(tmp_path):
    with node_with(tmp_path, running(), None) as n:
        assert doctor(n)["C2"]["verdict"] == "warning"


def test_a_stopped_daemon_says_so(tmp_path):
    status = json.loads((RECORDED / "status_stopped.json").read_text())
    with node_with(tmp_path, status, "serve_status.json") as n:
        checks = doctor(n)
        assert checks["C1"]["verdict"] == "needs action"
        assert checks["C1"]["detail"] == ("Tailscale is stopped on this machine (backend state Stopped): "
                                          "run `tailscale up`")
        assert checks["C3"]["verdict"] == "needs action"
        with n.client(headers=n.headers()) as c:
            assert c.get(P + "/status").json()["localNode"]["tailscaleConnected"] is False


def test_control_plane_offline_is_a_warning(tmp_path):
    status = running()
    status["Self"]["Online"] = False
    with node_with(tmp_path, status, "serve_status.json") as n:
        c1 = doctor(n)["C1"]
        assert c1["verdict"] == "warning" and "offline" in c1["detail"]
