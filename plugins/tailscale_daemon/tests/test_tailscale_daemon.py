"""The local Tailscale daemon directory, against the recorded status fixture."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pluggy
from hubpool_tailscale_daemon import TailscaleDaemonDirectory
from hubpool_tailscale_daemon.directory import MISSING_SENTENCE

from hubpool_core import DirectoryCandidate, TailnetStatus, hookspecs

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "data" / "tailscale_status.json"

EXPECTED = [
    DirectoryCandidate(
        node_fqdn="hub-b.example-tailnet.ts.net",
        hostname="hub-b",
        source="tailscale_daemon",
        device_id="nB2c3D4e5F6CNTRL",
        os="linux",
        online=True,
    ),
    DirectoryCandidate(
        node_fqdn="hub-c.example-tailnet.ts.net",
        hostname="hub-c",
        source="tailscale_daemon",
        device_id="nC3d4E5f6G7CNTRL",
        os="linux",
        online=True,
    ),
    DirectoryCandidate(
        node_fqdn="macbook.example-tailnet.ts.net",
        hostname="macbook",
        source="tailscale_daemon",
        device_id="nD4e5F6g7H8CNTRL",
        os="macOS",
        online=False,
    ),
    DirectoryCandidate(
        node_fqdn="pixel.example-tailnet.ts.net",
        hostname="pixel",
        source="tailscale_daemon",
        device_id="nE5f6G7h8I9CNTRL",
        os="android",
        online=True,
    ),
]

EXPECTED_STATUS = TailnetStatus(
    connected=True,
    self_fqdn="hub-a.example-tailnet.ts.net",
    suffix="example-tailnet.ts.net",
    serving=None,  # the fixture alone has no recorded `serve status` beside it: cannot tell
    error=None,
    https_certs=True,
    online=True,
    backend_state="Running",
    tailnet_name="operator@example.com",
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def env(cli: str) -> SimpleNamespace:
    return SimpleNamespace(tailscale_cli=cli)


def fake_cli(tmp_path: Path, body: str) -> tuple[str, Path]:
    """A tiny stand-in for the tailscale binary; returns (command line, call log)."""
    calls = tmp_path / "calls.log"
    script = tmp_path / "fake_tailscale.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys, time
            with open({str(calls)!r}, "a") as f:
                f.write(json.dumps(sys.argv[1:]) + "\\n")
            """
        )
        + textwrap.dedent(body)
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}", calls


def printing_fixture(tmp_path: Path, status: dict | None = None, serve: dict | None = None) -> tuple[str, Path]:
    """A fake tailscale answering `status --json` with ``status`` (the fixture by default) and
    `serve status --json` with ``serve`` (failing like a daemon too old to know the verb when
    None)."""
    data = tmp_path / "answer.bin"
    data.write_text(json.dumps(status) if status is not None else FIXTURE.read_text())
    serve_data = tmp_path / "serve.bin"
    if serve is not None:
        serve_data.write_text(json.dumps(serve))
    return fake_cli(
        tmp_path,
        f"""
        if sys.argv[1:2] == ["serve"]:
            try:
                sys.stdout.write(open({str(serve_data)!r}).read())
            except FileNotFoundError:
                sys.stderr.write("unknown subcommand: serve\\n")
                sys.exit(1)
        else:
            sys.stdout.write(open({str(data)!r}).read())
        """,
    )


def calls_of(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def status_reads(log: Path) -> list[list[str]]:
    """The `status --json` spawns (each read of a Running daemon also asks `serve status`)."""
    return [c for c in calls_of(log) if c == ["status", "--json"]]


def sorted_candidates(cands: list[DirectoryCandidate]) -> list[DirectoryCandidate]:
    return sorted(cands, key=lambda c: c.node_fqdn)


# -- the fixture ---------------------------------------------------------------------


def test_fixture_has_the_shape_of_tailscale_status_json():
    data = json.loads(FIXTURE.read_text())
    assert data["BackendState"] == "Running"
    assert data["AuthURL"] == ""
    assert data["Self"]["DNSName"] == "hub-a.example-tailnet.ts.net."
    assert data["Self"]["TailscaleIPs"] == ["100.64.0.1", "fd7a:115c:a1e0::1"]
    assert data["CurrentTailnet"]["MagicDNSEnabled"] is True
    for key, peer in data["Peer"].items():
        assert key.startswith("nodekey:") and peer["PublicKey"] == key
        assert peer["DNSName"].endswith(".example-tailnet.ts.net.")
        assert all(ip.startswith(("100.64.", "fd7a:115c:a1e0:")) for ip in peer["TailscaleIPs"])


# -- reading a recorded .json file -----------------------------------------------------


def test_reads_a_recorded_json_file():
    d = TailscaleDaemonDirectory(env(str(FIXTURE)))
    assert d.name == "tailscale_daemon"
    assert d.configured()
    assert sorted_candidates(asyncio.run(d.candidates())) == EXPECTED
    assert asyncio.run(d.tailnet_status()) == EXPECTED_STATUS
    assert asyncio.run(d.members()) is None


def test_cat_of_a_json_file_reads_the_file():
    d = TailscaleDaemonDirectory(env(f"cat {shlex.quote(str(FIXTURE))}"))
    assert d.configured()
    assert sorted_candidates(asyncio.run(d.candidates())) == EXPECTED


# -- running a command ---------------------------------------------------------------


def test_runs_the_command_with_status_json(tmp_path):
    cli, log = printing_fixture(tmp_path)
    d = TailscaleDaemonDirectory(env(cli))
    assert d.configured()
    assert sorted_candidates(asyncio.run(d.candidates())) == EXPECTED
    assert asyncio.run(d.tailnet_status()) == EXPECTED_STATUS
    # one status read served both; the daemon was also asked what `tailscale serve` publishes
    assert calls_of(log) == [["status", "--json"], ["serve", "status", "--json"]]


def test_status_is_cached_for_30_seconds(tmp_path):
    cli, log = printing_fixture(tmp_path)
    clock = FakeClock()
    d = TailscaleDaemonDirectory(env(cli), clock=clock)

    asyncio.run(d.candidates())
    clock.now += 29.9
    asyncio.run(d.tailnet_status())
    asyncio.run(d.candidates())
    assert len(status_reads(log)) == 1

    clock.now += 0.2  # 30.1 s after the read
    asyncio.run(d.candidates())
    assert len(status_reads(log)) == 2

    d.invalidate()
    asyncio.run(d.tailnet_status())
    assert len(status_reads(log)) == 3


def test_a_fresh_answer_is_asked_again_without_touching_the_file_system(tmp_path, monkeypatch):
    """Every signed peer forward asks for this node's name: within the cache window neither
    configured() (a stat, or a PATH search) nor the status parse runs again."""
    from hubpool_tailscale_daemon import directory as module

    status_file = tmp_path / "status.json"
    status_file.write_text(FIXTURE.read_text())
    clock = FakeClock()
    d = TailscaleDaemonDirectory(env(str(status_file)), clock=clock)
    first = asyncio.run(d.tailnet_status())
    assert first == EXPECTED_STATUS

    def no_stat(_inv):
        raise AssertionError("configured() looked at the file system again within the cache window")

    monkeypatch.setattr(module, "_resolvable", no_stat)
    clock.now += 29.9
    assert d.configured()
    assert asyncio.run(d.tailnet_status()) is first  # parsed once per reading
    monkeypatch.undo()

    status_file.unlink()  # the cache ran out: the file's absence is seen
    clock.now += 0.2
    assert not d.configured()
    assert asyncio.run(d.tailnet_status()) == TailnetStatus(connected=False, error=MISSING_SENTENCE)


def test_concurrent_callers_share_one_spawn(tmp_path):
    cli, log = printing_fixture(tmp_path)
    d = TailscaleDaemonDirectory(env(cli))

    async def many():
        return await asyncio.gather(*(d.candidates() for _ in range(5)), d.tailnet_status())

    results = asyncio.run(many())
    assert all(sorted_candidates(r) == EXPECTED for r in results[:5])
    assert len(status_reads(log)) == 1


# -- what a tailnet that is not up looks like ------------------------------------------


def test_stopped_backend_is_not_connected(tmp_path):
    data = json.loads(FIXTURE.read_text())
    data.update(BackendState="Stopped", Peer=None, MagicDNSSuffix="")
    data["Self"]["DNSName"] = ""
    data["CurrentTailnet"] = None
    cli, log = printing_fixture(tmp_path, data)
    d = TailscaleDaemonDirectory(env(cli))
    status = asyncio.run(d.tailnet_status())
    assert status.connected is False and status.backend_state == "Stopped"
    assert status.error == "Tailscale is stopped on this machine (backend state Stopped): run `tailscale up`"
    assert status.https_certs is None and status.serving is None  # nothing to judge on a stopped daemon
    assert asyncio.run(d.candidates()) == []
    assert calls_of(log) == [["status", "--json"]]  # a stopped daemon serves nothing: not asked


def test_magicdns_off_means_no_suffix(tmp_path):
    data = json.loads(FIXTURE.read_text())
    data["MagicDNSSuffix"] = ""
    data["CurrentTailnet"]["MagicDNSEnabled"] = False
    cli, _ = printing_fixture(tmp_path, data)
    status = asyncio.run(TailscaleDaemonDirectory(env(cli)).tailnet_status())
    assert status.connected is True
    assert status.suffix is None


def test_suffix_falls_back_to_current_tailnet(tmp_path):
    data = json.loads(FIXTURE.read_text())
    data["MagicDNSSuffix"] = ""
    cli, _ = printing_fixture(tmp_path, data)
    status = asyncio.run(TailscaleDaemonDirectory(env(cli)).tailnet_status())
    assert status.suffix == "example-tailnet.ts.net"


def test_peers_without_a_dns_name_are_skipped_and_names_are_normalised(tmp_path):
    data = json.loads(FIXTURE.read_text())
    peers = list(data["Peer"].values())
    peers[0]["DNSName"] = "Hub-B.Example-Tailnet.TS.net."
    peers[1]["DNSName"] = ""
    peers[2].pop("DNSName")
    peers[3].pop("Online")
    peers[3]["OS"] = ""
    peers[3].pop("ID")
    cli, _ = printing_fixture(tmp_path, data)
    got = sorted_candidates(asyncio.run(TailscaleDaemonDirectory(env(cli)).candidates()))
    assert got == [
        EXPECTED[0],
        DirectoryCandidate(
            node_fqdn="pixel.example-tailnet.ts.net",
            hostname="pixel",
            source="tailscale_daemon",
            device_id="",
            os=None,
            online=None,
        ),
    ]


# -- failures never raise ------------------------------------------------------------


def test_missing_command_spawns_nothing_and_says_so(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("nothing may be spawned")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", boom)
    for cli in (str(tmp_path / "no-such-tailscale"), "definitely-not-a-tailscale-binary-xyz"):
        d = TailscaleDaemonDirectory(env(cli))
        assert not d.configured()
        assert asyncio.run(d.candidates()) == []
        assert asyncio.run(d.tailnet_status()) == TailnetStatus(connected=False, error=MISSING_SENTENCE)


def test_missing_json_file_is_not_configured(tmp_path):
    d = TailscaleDaemonDirectory(env(str(tmp_path / "absent.json")))
    assert not d.configured()
    assert asyncio.run(d.candidates()) == []
    status = asyncio.run(d.tailnet_status())
    assert status.connected is False and status.error == MISSING_SENTENCE


def test_default_command_is_tailscale():
    d = TailscaleDaemonDirectory(SimpleNamespace())
    assert d.cli == "tailscale"
    d = TailscaleDaemonDirectory(SimpleNamespace(tailscale_cli=""))
    assert d.cli == "tailscale"


def test_unparseable_command_line_is_not_configured():
    d = TailscaleDaemonDirectory(env('tailscale "unbalanced'))
    assert not d.configured()
    assert asyncio.run(d.candidates()) == []


def test_failing_command_answers_not_connected_with_its_stderr(tmp_path, caplog):
    cli, _ = fake_cli(
        tmp_path,
        """
        sys.stderr.write("failed to connect to local tailscaled; it doesn't appear to be running\\n")
        sys.exit(1)
        """,
    )
    d = TailscaleDaemonDirectory(env(cli))
    with caplog.at_level("WARNING"):
        status = asyncio.run(d.tailnet_status())
    assert status.connected is False
    assert "failed (exit 1)" in status.error
    assert "tailscaled" in status.error
    assert asyncio.run(d.candidates()) == []
    assert any("tailscaled" in r.getMessage() for r in caplog.records)


def test_garbage_output_is_an_error_not_an_exception(tmp_path):
    cli, _ = fake_cli(tmp_path, 'print("this is not json {")')
    d = TailscaleDaemonDirectory(env(cli))
    assert asyncio.run(d.candidates()) == []
    status = asyncio.run(d.tailnet_status())
    assert status.connected is False and "not JSON" in status.error


def test_json_that_is_not_an_object(tmp_path):
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2, 3]")
    d = TailscaleDaemonDirectory(env(str(bad)))
    assert asyncio.run(d.candidates()) == []
    assert asyncio.run(d.tailnet_status()).error.endswith("not a status object")


def test_hung_command_times_out(tmp_path):
    cli, _ = fake_cli(tmp_path, "time.sleep(30)")
    d = TailscaleDaemonDirectory(env(cli), timeout=0.5)
    status = asyncio.run(d.tailnet_status())
    assert status.connected is False
    assert "did not answer within 0.5 s" in status.error
    assert asyncio.run(d.candidates()) == []


def test_failures_are_cached_too(tmp_path):
    cli, log = fake_cli(tmp_path, "sys.exit(3)")
    clock = FakeClock()
    d = TailscaleDaemonDirectory(env(cli), clock=clock)
    asyncio.run(d.tailnet_status())
    asyncio.run(d.candidates())
    assert len(calls_of(log)) == 1
    clock.now += 31
    asyncio.run(d.candidates())
    assert len(calls_of(log)) == 2


# -- registration --------------------------------------------------------------------


def test_registers_through_the_hook():
    import hubpool_tailscale_daemon

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(hubpool_tailscale_daemon)
    got: list[type] = []
    pm.hook.hubpool_register_directories(register=got.append)
    assert got == [TailscaleDaemonDirectory]


# -- what the daemon says about certificates, serve and its state (recorded answers) ----

DATA = Path(__file__).resolve().parent / "data"
ME = "hub-a.example-tailnet.ts.net"


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def listening_env(cli: str, port: int = 5002) -> SimpleNamespace:
    return SimpleNamespace(tailscale_cli=cli, host_port=("127.0.0.1", port))


def both_ways(tmp_path: Path, status: dict, serve: dict | None, port: int = 5002) -> list[TailnetStatus]:
    """The status a running command answers and the one a recorded file pair answers: the
    two must agree."""
    cli, _ = printing_fixture(tmp_path, status, serve)
    by_command = asyncio.run(TailscaleDaemonDirectory(listening_env(cli, port)).tailnet_status())
    files = tmp_path / "recorded"
    files.mkdir()
    (files / "hub-a.json").write_text(json.dumps(status))
    if serve is not None:
        (files / "hub-a.serve.json").write_text(json.dumps(serve))
    by_file = asyncio.run(TailscaleDaemonDirectory(listening_env(str(files / "hub-a.json"), port)).tailnet_status())
    assert by_command == by_file
    return [by_command, by_file]


def test_certificates_and_serve_both_ready(tmp_path):
    for status in both_ways(tmp_path, json.loads(FIXTURE.read_text()), recorded("serve_status.json")):
        assert status.connected and status.self_fqdn == ME
        assert status.https_certs is True  # CertDomains names this node
        assert status.serving is True and status.serve_detail is None  # https://<name>/ -> this node's port
        assert status.online is True and status.backend_state == "Running"
        assert status.tailnet_name == "operator@example.com"


def test_https_certificates_off(tmp_path):
    status = both_ways(tmp_path, recorded("status_https_off.json"), recorded("serve_status.json"))[0]
    assert status.connected is True and status.https_certs is False


def test_certificates_for_another_name_are_not_this_nodes(tmp_path):
    data = json.loads(FIXTURE.read_text())
    data["CertDomains"] = ["other.example-tailnet.ts.net"]
    assert both_ways(tmp_path, data, None)[0].https_certs is False


def test_serve_publishing_nothing(tmp_path):
    status = both_ways(tmp_path, json.loads(FIXTURE.read_text()), recorded("serve_status_empty.json"))[0]
    assert status.serving is False
    assert status.serve_detail == f"`tailscale serve` publishes nothing at https://{ME}/"


def test_serve_publishing_another_port(tmp_path):
    status = both_ways(tmp_path, json.loads(FIXTURE.read_text()), recorded("serve_status_other_target.json"))[0]
    assert status.serving is False
    assert status.serve_detail == f"https://{ME}/ is served by http://127.0.0.1:8080, not by this node (port 5002)"
    # the same answer read by the node on 8080 is this node
    (tmp_path / "b").mkdir()
    assert both_ways(tmp_path / "b", json.loads(FIXTURE.read_text()),
                     recorded("serve_status_other_target.json"), port=8080)[0].serving is True


def test_serve_status_unreadable_is_cannot_tell(tmp_path):
    status = both_ways(tmp_path, json.loads(FIXTURE.read_text()), None)[0]
    assert status.serving is None and status.connected is True


def test_a_stopped_daemon(tmp_path):
    for status in both_ways(tmp_path, recorded("status_stopped.json"), recorded("serve_status.json")):
        assert status.connected is False and status.backend_state == "Stopped"
        assert status.error == "Tailscale is stopped on this machine (backend state Stopped): run `tailscale up`"
        assert status.https_certs is None and status.serving is None


def test_a_daemon_that_needs_a_login(tmp_path):
    status = both_ways(tmp_path, recorded("status_needs_login.json"), None)[0]
    assert status.connected is False and status.backend_state == "NeedsLogin"
    assert "tailscale up" in status.error and "log in" in status.error
    assert status.self_fqdn is None and status.tailnet_name is None


def test_control_plane_offline(tmp_path):
    status = both_ways(tmp_path, recorded("status_control_offline.json"), recorded("serve_status.json"))[0]
    assert status.connected is True and status.online is False
