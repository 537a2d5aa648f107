"""Real network faults: each node in its own Linux network namespace, with its own address on a
bridge the rig creates (and removes), so a partition is a real one and not a proxy's.

Layout: a bridge in the root namespace holds ``<prefix>.1`` (where the test itself talks to the
nodes from); node ``i`` lives in namespace ``hp<pid>-<name>`` with ``eth0`` = ``<prefix>.<11+i>``
on a veth pair whose other end is on the bridge. The prefix is inside the tailnet's CGNAT range
(100.64.0.0/10), as a real tailnet address would be. Every node listens on 0.0.0.0:8080 and its
simulated engine on the namespace's own loopback; peers dial each other by name
(``http://<fqdn>:8080`` through HUB_POOL_PEER_URLS) and the name resolves through the
namespace's own hosts file (``ip netns exec`` binds ``/etc/netns/<ns>/hosts`` over /etc/hosts),
so moving a node to a new address is what a DNS change is: the name now says the new address.

Faults are silent drops, done with policy routing only (the kernel has no netem and this box
no nft/iptables binaries): in the *receiving* namespace a rule ``from <src> iif eth0 blackhole``
drops the sender's packets before any socket sees them; with ``forwarding`` off no ICMP is sent,
so the sender's connect or read just hangs, as across a real partition. The namespace's
``lookup local`` rule is moved from priority 0 to 100 so these rules (priority 10) come first.
A ``dport`` on the rule drops only what the sender sends *to* that port: the namespace's own
connections to the sender still get their replies, which is the asymmetric fault (A reaches B,
B cannot reach A).

Every command runs ``ip``; ``unavailable()`` says why this cannot work here (not root, no
``ip``, namespaces refused) so the tests skip with that sentence.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from harness import DATA, fqdn
from process_harness import NodeProcess, SimProcess

NODE_PORT = 8080
ENGINE_PORT = 11434
NETNS_ETC = Path("/etc/netns")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=20)


def unavailable() -> str | None:
    """Why namespaced tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, as .ci/run does)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed: apt-get install iproute2"
    probe = f"hpprobe{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is refused here: {made.stderr.strip() or made.returncode}"
    try:
        ran = subprocess.run(["ip", "netns", "exec", probe, "true"], capture_output=True, text=True, timeout=20)
        if ran.returncode != 0:
            return f"`ip netns exec` is refused here: {ran.stderr.strip() or ran.returncode}"
    finally:
        ip("netns", "del", probe, check=False)
    return None


def sweep_stale() -> None:
    """Remove what a killed run left behind (its finalizers never ran): namespaces named
    ``hp<pid>-<node>`` whose pid is gone, the processes still inside them, their hosts files and
    bridge. Only this module makes names of that shape."""
    listing = ip("netns", "list", check=False).stdout
    for line in listing.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = re.fullmatch(r"hp(\d+)-[a-z0-9-]+", ns)
        if m is None or Path(f"/proc/{m.group(1)}").exists():
            continue
        for pid in ip("netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        ip("netns", "del", ns, check=False)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        ip("link", "del", f"hpb{m.group(1)}", check=False)


class Netns:
    """The bridge, one namespace per name, and the drop rules in force."""

    def __init__(self, names: list[str]):
        pid = os.getpid()
        self.tag = str(pid)  # the owner's pid: sweep_stale knows a dead run's leftovers by it
        self.prefix = f"100.{80 + pid % 40}.{(pid // 40) % 250}"
        self.bridge = f"hpb{self.tag}"
        self.names = names
        self.ns = {n: f"hp{self.tag}-{n}" for n in names}
        self.addr = {n: f"{self.prefix}.{11 + i}" for i, n in enumerate(names)}
        self.gateway = f"{self.prefix}.1"
        self.rules: list[tuple[str, tuple[str, ...]]] = []
        self._made: list[str] = []

    # -- lifecycle ------------------------------------------------------------------------

    def create(self) -> Netns:
        sweep_stale()
        ip("link", "add", self.bridge, "type", "bridge")
        self._made.append("bridge")
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            ns, veth = self.ns[name], f"hpv{self.tag}x{i}"
            ip("netns", "add", ns)
            self._made.append(ns)
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("link", "set", veth, "master", self.bridge, "up")
            ip("-n", ns, "addr", "add", f"{self.addr[name]}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", "eth0", "up")
            # the drop rules must be read before the local table, which would deliver first
            ip("-n", ns, "rule", "add", "pref", "100", "lookup", "local")
            ip("-n", ns, "rule", "del", "pref", "0")
        self.write_hosts()
        return self

    def close(self) -> None:
        """Remove every namespace, the bridge (its veths go with the namespaces) and hosts files."""
        for name in self.names:
            ns = self.ns[name]
            if ns in self._made:
                ip("netns", "del", ns, check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        if "bridge" in self._made:
            ip("link", "del", self.bridge, check=False)
        self._made.clear()

    def write_hosts(self) -> None:
        """Each namespace's /etc/hosts: every node's FQDN at its current address. Written in
        place (same inode), so a file already bound over a running process's /etc/hosts changes."""
        lines = ["127.0.0.1 localhost", *(f"{self.addr[n]} {fqdn(n)} {n}" for n in self.names)]
        for name in self.names:
            d = NETNS_ETC / self.ns[name]
            d.mkdir(parents=True, exist_ok=True)
            with open(d / "hosts", "w") as f:
                f.write("\n".join(lines) + "\n")

    def exec_prefix(self, name: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[name]]

    # -- faults ---------------------------------------------------------------------------

    def drop(self, at: str, sender: str, dport: int | None = None) -> None:
        """``at`` silently drops what ``sender`` sends it (with ``dport``, only what it sends to
        that port, on new or kept-alive connections: ``at``'s own connections to ``sender``
        still get their answers)."""
        spec = ("pref", "10", "from", f"{self.addr[sender]}/32", "iif", "eth0")
        if dport is not None:
            spec += ("ipproto", "tcp", "dport", str(dport))
        spec += ("blackhole",)
        ip("-n", self.ns[at], "rule", "add", *spec)
        self.rules.append((at, spec))

    def partition(self, side_a: list[str], side_b: list[str]) -> None:
        """Nothing crosses between the two sides, in either direction."""
        for x in side_a:
            for y in side_b:
                self.drop(x, y)
                self.drop(y, x)

    def isolate(self, name: str) -> None:
        self.partition([name], [n for n in self.names if n != name])

    def heal(self) -> None:
        for at, spec in self.rules:
            ip("-n", self.ns[at], "rule", "del", *spec, check=False)
        self.rules.clear()

    def move(self, name: str, new_addr: str) -> None:
        """``name`` takes ``new_addr`` and loses its old one; every hosts file says so."""
        old = self.addr[name]
        # old first: deleting a subnet's primary address takes its secondaries with it
        ip("-n", self.ns[name], "addr", "del", f"{old}/24", "dev", "eth0")
        ip("-n", self.ns[name], "addr", "add", f"{new_addr}/24", "dev", "eth0")
        self.addr[name] = new_addr
        self.write_hosts()


def tailnet_status(netns: Netns, name: str) -> dict[str, Any]:
    """The recorded `tailscale status --json` shape, for ``name`` among ``netns.names``, at
    the namespaces' addresses (the recorded tailnet names only three hubs; this says N)."""
    base = json.loads((DATA / "tailscale_status.json").read_text())
    template = base["Self"]

    def entry(n: str) -> dict[str, Any]:
        e = copy.deepcopy(template)
        addr = netns.addr[n]
        e.update({"ID": f"n{n}", "HostName": n, "DNSName": fqdn(n) + ".", "TailscaleIPs": [addr],
                  "AllowedIPs": [f"{addr}/32"], "PeerAPIURL": [f"http://{addr}:38811"],
                  "PublicKey": "nodekey:" + uuid.uuid5(uuid.NAMESPACE_DNS, n).hex * 2})
        return e

    base["Self"] = entry(name)
    base["TailscaleIPs"] = [netns.addr[name]]
    base["Peer"] = {f"nodekey:{n}": entry(n) for n in netns.names if n != name}
    return base


class NsNode(NodeProcess):
    """A `hubpool serve` process inside its namespace, reached at its namespace address."""

    def __init__(self, netns: Netns, name: str, root: Path, environ: dict[str, str]):
        super().__init__(name, root, NODE_PORT, environ)
        self.netns = netns
        self.environ["HUB_POOL_LISTEN"] = f"0.0.0.0:{NODE_PORT}"
        self.url = f"http://{netns.addr[name]}:{NODE_PORT}"

    def readdress(self) -> None:
        self.url = f"http://{self.netns.addr[self.name]}:{NODE_PORT}"

    def _spawn(self, args: list[str], stdin: int) -> subprocess.Popen:
        with open(self.log_path, "ab") as log:
            return subprocess.Popen([*self.netns.exec_prefix(self.name), sys.executable, *args], env=self.environ,
                                    cwd=str(self.data_dir.parent), stdin=stdin, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)


class NsSim(SimProcess):
    """The node's simulated engine, in the same namespace (the node reaches it on loopback)."""

    def __init__(self, netns: Netns, name: str, root: Path, args: list[str]):
        super().__init__(f"{name}-engine", root, args)
        self.netns, self.node = netns, name
        self.port = ENGINE_PORT
        self.url = f"http://{netns.addr[name]}:{ENGINE_PORT}"

    def launch(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        self.boots += 1
        self.url = f"http://{self.netns.addr[self.node]}:{ENGINE_PORT}"
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.netns.exec_prefix(self.node), sys.executable, "-m", "hubpool_sim.cli",
                 "--host", "0.0.0.0", "--port", str(self.port), *self.args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.stopped = False


class NetnsRig:
    """Nodes ``names``, each with its simulated engine in its own namespace, all paired with
    each other through the operator API over the bridge. ``env`` goes to every node."""

    def __init__(self, root: Path, names: list[str], sim: list[str], env: dict[str, str]):
        self.root, self.names = root, names
        self.netns = Netns(names)
        self.fqdns = {n: fqdn(n) for n in names}
        urls = json.dumps({fqdn(n): f"http://{fqdn(n)}:{NODE_PORT}" for n in names})
        self.sims = {n: NsSim(self.netns, n, root, sim) for n in names}
        self.nodes: dict[str, NsNode] = {}
        for n in names:
            status_file = root / f"{n}-tailscale.json"
            status_file.write_text(json.dumps(tailnet_status(self.netns, n)))
            self.nodes[n] = NsNode(self.netns, n, root, {
                "HUB_POOL_TAILSCALE_CLI": str(status_file), "HUB_POOL_PEER_URLS": urls,
                "OLLAMA_URL": f"http://127.0.0.1:{ENGINE_PORT}", **env})
        self.setup_s = 0.0

    def start(self, connect_timeout: float = 90.0) -> NetnsRig:
        import itertools
        import time

        from process_harness import pair, wait_connected

        t0 = time.monotonic()
        self.netns.create()
        try:
            for s in self.sims.values():
                s.launch()
            for node in self.nodes.values():
                node.launch()
            for s in self.sims.values():
                s.wait_ready(40)
            for node in self.nodes.values():
                node.wait_ready(60)
            for x, y in itertools.combinations(self.names, 2):
                pair(self.nodes, x, y)
            from rig import MODEL

            wait_connected(self.nodes, timeout=connect_timeout, model=MODEL)  # type: ignore[arg-type]
        except BaseException:
            self.close()
            raise
        self.setup_s = time.monotonic() - t0
        return self

    def close(self) -> None:
        for node in self.nodes.values():
            try:
                node.stop(grace=3)
            except Exception:  # noqa: BLE001 - keep stopping the rest
                node.kill()
        for s in self.sims.values():
            s.kill()
        self.netns.close()

    def __enter__(self) -> NetnsRig:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reading the nodes ----------------------------------------------------------------

    def log(self, name: str) -> list[dict[str, Any]]:
        return self.nodes[name].op("GET", "/routing-log?limit=10000")["entries"]

    def logs(self, settle_s: float = 10.0) -> dict[str, list[dict[str, Any]]]:
        from history import wait_settled

        return {n: wait_settled(lambda n=n: self.log(n), settle_s) for n in self.names}

    def view(self, observer: str) -> dict[str, dict[str, Any]]:
        """``observer``'s rows for its peers, by peer name."""
        by_fqdn = {v: k for k, v in self.fqdns.items()}
        return {by_fqdn[p["nodeFqdn"]]: p for p in self.nodes[observer].op("GET", "/peers", timeout=5)
                if p["nodeFqdn"] in by_fqdn}

    def move(self, name: str, new_addr: str) -> None:
        self.netns.move(name, new_addr)
        self.nodes[name].readdress()
        self.sims[name].url = f"http://{new_addr}:{ENGINE_PORT}"
