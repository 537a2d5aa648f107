"""`hubpool demo`: a three-node pool on loopback with simulated engines, no GPU and no tailnet.

Three simulated engines run in this process (threads). Each node is a real `hubpool serve` in its own
process, data directory and recorded tailnet answer. The demo pairs the nodes through the operator API
the way an operator would, with PINs. Then it sends a few requests to hub-a, prints where each one ran,
and keeps the pool up until Ctrl-C.

The simulator adds this command to the hubpool CLI through the plugin hook, so the core never imports
the simulator (or names an engine). Nothing here reads the test suite: the tailnet answer each node reads
is generated below.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
TAILNET = "example-tailnet.ts.net"
#: every engine variable a node reads; the ones a node does not use point at a closed port, so
#: they show as not running instead of reaching an engine that happens to run on this machine
ENGINE_VARS = ("OLLAMA_URL", "VLLM_URL", "LLAMACPP_URL", "LEMONADE_URL", "OMLX_URL")
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10
#: the health poll interval the demo's nodes start with (the setting's minimum; the default is 30)
HEALTH_POLL_S = 10
DECODE_MS_PER_TOKEN = 20
ANSWER_TOKENS = 24
LOG_FILE = "node.log"
CHAT = [{"role": "user", "content": "hello"}]


@dataclass
class Hub:
    """One node and its simulated engine."""

    name: str
    flavor: str  # the simulator flavor, also the engine's kind
    product: str  # what the flavor imitates, for humans
    engine_var: str
    models: list[SimModel]
    port: int = 0
    data_dir: Path = Path()
    sim: Any = None
    proc: subprocess.Popen | None = None
    operator_key: str = ""
    exit_reported: bool = field(default=False, repr=False)

    @property
    def fqdn(self) -> str:
        return f"{self.name}.{TAILNET}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE

    def op(self, method: str, path: str, body: Any = None) -> Any:
        """One operator call, as the CLI would make it; a refusal becomes a DemoError."""
        try:
            r = httpx.request(method, self.url + P + path, json=body, timeout=30, trust_env=False,
                              headers={"Authorization": f"Bearer {self.operator_key}"})
        except httpx.HTTPError as exc:
            raise DemoError(f"{self.name} did not answer {method} {P}{path} ({type(exc).__name__}: {exc}).",
                            self) from None
        if r.status_code != 200:
            try:
                why = r.json().get("error") or r.text
            except ValueError:
                why = r.text
            raise DemoError(f"{self.name} refused {method} {P}{path} ({r.status_code}): {why}", self)
        return r.json()


def demo_hubs() -> list[Hub]:
    return [
        Hub("hub-a", "ollama", "Ollama", "OLLAMA_URL",
            [SimModel("llama3.2:3b", window=8192), SimModel("nomic-embed-text", window=2048, embedding=True)]),
        Hub("hub-b", "vllm", "vLLM", "VLLM_URL",
            [SimModel("qwen3:8b", window=16384), SimModel("llama3.2:3b", window=8192)]),
        Hub("hub-c", "llamacpp", "llama.cpp", "LLAMACPP_URL", [SimModel("gemma3:4b", window=8192)]),
    ]


class DemoError(Exception):
    """A step failed; the message is the sentence to print. ``hub`` names the node whose log
    tail helps, if any."""

    def __init__(self, message: str, hub: Hub | None = None):
        super().__init__(message)
        self.hub = hub


class Stop(Exception):
    """SIGTERM or SIGHUP: stop like Ctrl-C."""


# -- the recorded tailnet each node reads -------------------------------------------------

def tailnet_status(me: str, names: list[str]) -> dict[str, Any]:
    """A minimal `tailscale status --json` answer as node ``me`` sees the tailnet of ``names``:
    what the tailscale_daemon directory reads (Self, Peer, BackendState, the MagicDNS suffix)."""

    def device(i: int, name: str) -> dict[str, Any]:
        return {
            "ID": f"nDemo{i + 1}CNTRL",
            "PublicKey": "nodekey:" + f"{i + 1:x}" * 64,
            "HostName": name,
            "DNSName": f"{name}.{TAILNET}.",
            "OS": "linux",
            "UserID": 1000001,
            "TailscaleIPs": [f"100.64.0.{i + 1}", f"fd7a:115c:a1e0::{i + 1}"],
            "Online": True,
        }

    devices = {name: device(i, name) for i, name in enumerate(names)}
    return {
        "Version": "1.76.6",
        "BackendState": "Running",
        "TailscaleIPs": devices[me]["TailscaleIPs"],
        "Self": devices[me],
        "MagicDNSSuffix": TAILNET,
        "CurrentTailnet": {"Name": "operator@example.com", "MagicDNSSuffix": TAILNET, "MagicDNSEnabled": True},
        "CertDomains": [f"{me}.{TAILNET}"],
        "Peer": {d["PublicKey"]: d for name, d in devices.items() if name != me},
        "User": {"1000001": {"ID": 1000001, "LoginName": "operator@example.com", "DisplayName": "Demo Operator"}},
    }


# -- ports and processes --------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no obstacle
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def node_environ(hub: Hub, hubs: list[Hub], dead_url: str, status_file: Path) -> dict[str, str]:
    """This process's environment minus anything that would point the node elsewhere (a shared
    database, an operator key, a real tailnet's credentials), plus the node's own settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HUB_", "CI_HUB_", "TAILSCALE_")) and k not in ENGINE_VARS}
    env.update({var: dead_url for var in ENGINE_VARS})
    env[hub.engine_var] = hub.sim.url
    env.update({
        "HUB_POOL_DATA_DIR": str(hub.data_dir),
        "HUB_POOL_LISTEN": f"127.0.0.1:{hub.port}",
        "HUB_POOL_TAILSCALE_CLI": str(status_file),
        "HUB_POOL_PEER_URLS": json.dumps({h.fqdn: h.url for h in hubs}),
        "PYTHONUNBUFFERED": "1",
    })
    for var in ("NO_PROXY", "no_proxy"):  # a proxy configured here must not carry loopback traffic
        env[var] = ",".join(x for x in (env.get(var), "127.0.0.1", "localhost") if x)
    return env


def start_node(hub: Hub, env: dict[str, str]) -> None:
    with open(hub.log_path, "ab") as log:
        hub.proc = subprocess.Popen([sys.executable, "-m", "hubpool_core.cli", "serve"], env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def wait_until_up(hub: Hub, deadline: float) -> None:
    assert hub.proc is not None
    with httpx.Client(timeout=2, trust_env=False) as client:
        while True:
            code = hub.proc.poll()
            if code is not None:
                raise DemoError(f"{hub.name} exited with code {code} before it answered at {hub.url}.", hub)
            try:
                r = client.get(hub.url + P + "/identify")
                if r.status_code == 200 and r.json().get("isCiHub") is True:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise DemoError(f"{hub.name} did not answer at {hub.url} within {START_TIMEOUT_S} s.", hub)
            time.sleep(0.1)
    from hubpool_core.access.credentials import read_operator_key

    key = read_operator_key(hub.data_dir)  # minted at start, before the node listens
    if not key:
        raise DemoError(f"{hub.name} is up but left no operator key in {hub.data_dir}.", hub)
    hub.operator_key = key


def stop_nodes(hubs: list[Hub]) -> None:
    """SIGTERM to every node, then a kill for any still running after STOP_TIMEOUT_S."""
    running = [h for h in hubs if h.proc is not None and h.proc.poll() is None]
    for hub in running:
        try:
            hub.proc.terminate()
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for hub in running:
        try:
            hub.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say(f"{hub.name} did not stop within {STOP_TIMEOUT_S} s: killing it")
            hub.proc.kill()
            hub.proc.wait()


#: the node logs every outbound HTTP request at info level; a tail reads better without the ones that worked
_ROUTINE = re.compile(r'httpx: HTTP Request: .* "HTTP/[\d.]+ 2\d\d ')


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").rstrip("\n").splitlines()
    except OSError as exc:
        return f"    (could not read {path}: {exc.strerror or exc})"
    text = [line for line in text if not _ROUTINE.search(line)]
    return "\n".join("    " + line for line in text[-lines:]) or "    (nothing logged yet)"


def say(line: str = "") -> None:
    try:
        print(line, flush=True)
    except OSError:  # the terminal went away (SIGHUP): keep cleaning up
        pass


# -- the scripted part ----------------------------------------------------------------------

def pair(sender: Hub, receiver: Hub) -> None:
    """What an operator does: mint a PIN on the receiver, pair from the sender, approve on the receiver."""
    say(f"  pairing {sender.name} with {receiver.name} (PIN)…")
    pin = receiver.op("POST", "/pairing-pin")["pin"]
    sender.op("POST", "/peers/pair", {"nodeFqdn": receiver.fqdn, "pin": pin})
    receiver.op("POST", f"/peers/{sender.fqdn}/approve")


def wait_for_health_polls(hub: Hub, peers: list[Hub]) -> float:
    """Until ``hub`` has polled each of ``peers`` once: connected, with their capabilities (the
    models it may place on them). Health polls run at start and then every HEALTH_POLL_S."""
    started = time.monotonic()
    deadline = started + 2 * HEALTH_POLL_S
    waiting = {p.fqdn for p in peers}
    while True:
        rows = hub.op("GET", "/status")["peers"]
        waiting -= {p["nodeFqdn"] for p in rows if p["status"] == "connected" and p.get("lastCapabilities")}
        if not waiting:
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise DemoError(f"{hub.name} has not heard from {', '.join(sorted(waiting))} within "
                            f"{2 * HEALTH_POLL_S} s of pairing.", hub)
        time.sleep(0.25)


@dataclass
class Placed:
    request: str
    status: str
    served_by: str = "-"
    backend: str = "-"
    model: str = "-"
    ok: bool = False
    error: str = ""


def placed(request: str, r: httpx.Response, note: str = "") -> Placed:
    h = r.headers
    row = Placed(request, f"{r.status_code}{note}", h.get("x-hub-pool-served-by", "-"),
                 h.get("x-hub-pool-backend", "-"), h.get("x-hub-pool-model", "-"), r.status_code == 200)
    if not row.ok:
        try:
            row.error = str(r.json().get("error") or r.text)
        except ValueError:
            row.error = r.text[:300]
    return row


def send_requests(hub: Hub) -> list[Placed]:
    """A few requests to hub-a in both dialects: one each for a model it holds, a model only hub-b
    holds, one only hub-c holds, a stream an Ollama client reads from hub-b's vLLM, and auto."""
    rows = []

    def label(dialect: str, route: str, model: str) -> str:
        return f"{dialect:<6}  {route:<20}  {model}"

    with httpx.Client(base_url=hub.url, timeout=60, trust_env=False) as c:
        def openai(model: str) -> None:
            r = c.post("/v1/chat/completions", json={"model": model, "messages": CHAT})
            rows.append(placed(label("OpenAI", "/v1/chat/completions", model), r))

        def ollama(route: str, body: dict[str, Any]) -> None:
            r = c.post(route, json=body)
            rows.append(placed(label("Ollama", route, body["model"]), r))

        openai("llama3.2:3b")
        openai("qwen3:8b")
        ollama("/api/chat", {"model": "gemma3:4b", "messages": CHAT, "stream": False})
        with c.stream("POST", "/api/chat", json={"model": "qwen3:8b", "messages": CHAT, "stream": True}) as r:
            lines = sum(1 for line in r.iter_lines() if line.strip())
            rows.append(placed(label("Ollama", "/api/chat", "qwen3:8b, streamed"), r,
                               f", {lines} lines" if r.status_code == 200 else ""))
        openai("auto")
        ollama("/api/embed", {"model": "nomic-embed-text", "input": "hello"})
    return rows


def table(rows: list[Placed]) -> list[str]:
    cols = [("REQUEST", "request"), ("SERVED BY", "served_by"), ("BACKEND", "backend"), ("MODEL", "model"),
            ("STATUS", "status")]
    widths = [max(len(title), *(len(getattr(r, attr)) for r in rows)) for title, attr in cols]

    def line(values: list[str]) -> str:
        return "  " + "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return [line([t for t, _ in cols])] + [line([getattr(r, a) for _, a in cols]) for r in rows]


def cli_prefix() -> str:
    return "uv run hubpool" if os.environ.get("UV") else "hubpool"


def by_hand(hubs: list[Hub], root: Path) -> list[str]:
    a = hubs[0]
    cli = cli_prefix()

    def env(h: Hub) -> str:
        return f"HUB_POOL_DATA_DIR={shlex.quote(str(h.data_dir))} HUB_POOL_LISTEN=127.0.0.1:{h.port}"

    b = hubs[1]
    return [
        "Try it by hand. Apps talk to hub-a; it places each request on whichever node holds the model:",
        f"  curl -s {a.url}/v1/models",
        f"  curl -si {a.url}/v1/chat/completions -H 'Content-Type: application/json' \\",
        '       -d \'{"model": "qwen3:8b", "messages": [{"role": "user", "content": "hello"}]}\'',
        f"  curl -sN {a.url}/api/chat -d '{{\"model\": \"gemma3:4b\", \"messages\": "
        '[{"role": "user", "content": "hi"}]}\'',
        "",
        "The operator CLI finds a node through the same two variables as `hubpool serve`:",
        f"  {env(a)} {cli} status",
        f"  {env(a)} {cli} log",
        f"  {env(a)} {cli} peers",
        f"  {env(b)} {cli} log     # hub-b's side: the inbound rows",
        "",
        f"The web UI: open {a.url}/ in a browser and sign in with hub-a's operator key,",
        f"  {a.data_dir / 'operator.key'}",
        "",
        "Node logs (each node's stderr):",
        *(f"  {h.name}  {h.log_path}" for h in hubs),
        f"Data directories: {root} (kept when the demo stops)",
    ]


# -- the command ---------------------------------------------------------------------------

def run_demo(port: int = 5002, wait: bool = True) -> int:
    """Run the demo; the exit code is the return value."""
    hubs = demo_hubs()
    if not port_is_free(port):
        say(f"error: port {port} on 127.0.0.1 is already in use; choose another with --port.")
        return 1
    root = Path(tempfile.mkdtemp(prefix="hubpool-demo-"))
    handlers = {}
    original_sigint = signal.getsignal(signal.SIGINT)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            handlers[name] = signal.signal(getattr(signal, name), _raise_stop)
    say("hubpool demo: three nodes on loopback with simulated engines, paired through the API "
        "(no GPU, no tailnet).")
    code = 0
    with ExitStack() as sims:
        try:
            code = _run(hubs, root, port, wait, sims)
        except (KeyboardInterrupt, Stop):
            say()
        except DemoError as exc:
            say(f"error: {exc}")
            if exc.hub is not None:
                say(f"  the end of {exc.hub.name}'s log ({exc.hub.log_path}):")
                say(log_tail(exc.hub.log_path))
            code = 1
        finally:
            for name in handlers:  # a second Ctrl-C must not cut the cleanup short
                signal.signal(getattr(signal, name), signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                if any(h.proc is not None for h in hubs):
                    say("stopping the three nodes and the simulated engines…")
                stop_nodes(hubs)
                sims.close()
                say(f"stopped. The data directories and node logs stay in {root}")
            finally:
                signal.signal(signal.SIGINT, original_sigint)
                for name, previous in handlers.items():
                    signal.signal(getattr(signal, name), previous)
    return code


def _raise_stop(signum: int, frame: Any) -> None:
    # Disarm first: a second stop signal (uv forwards the one it got; a process group receives
    # one each) arriving before the cleanup ignores them would escape as a traceback.
    for name in ("SIGTERM", "SIGHUP", "SIGINT"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    raise Stop


def _run(hubs: list[Hub], root: Path, port: int, wait: bool, sims: ExitStack) -> int:
    say("  starting the simulated engines…")
    for hub in hubs:
        config = SimConfig(flavor=hub.flavor, port=0, models=hub.models, decode_ms_per_token=DECODE_MS_PER_TOKEN,
                           tokens=ANSWER_TOKENS)
        hub.sim = sims.enter_context(run_in_thread(config))
    taken = {port}
    for hub in hubs:
        if hub is hubs[0]:
            hub.port = port
        else:
            while (p := free_port()) in taken:
                pass
            hub.port = p
            taken.add(p)
        hub.data_dir = root / hub.name
        hub.data_dir.mkdir()
        # the interval a node starts with: a PATCH later would only apply after the first 30 s sleep
        (hub.data_dir / "settings.json").write_text(json.dumps({"poolHealthPollSeconds": HEALTH_POLL_S}))
    dead_url = f"http://127.0.0.1:{free_port()}"  # bound, then released: nothing listens there
    for hub in hubs:
        status_file = root / f"{hub.name}-tailscale-status.json"
        status_file.write_text(json.dumps(tailnet_status(hub.name, [h.name for h in hubs]), indent=2))
        say(f"  starting {hub.name} (hubpool serve on {hub.url})…")
        start_node(hub, node_environ(hub, hubs, dead_url, status_file))
    started = time.monotonic()
    for hub in hubs:
        wait_until_up(hub, started + START_TIMEOUT_S)
        say(f"  {hub.name} is up (pid {hub.proc.pid}, after {time.monotonic() - started:.1f} s)")
    a, b, c = hubs
    pair(a, b)
    pair(a, c)
    pair(b, c)
    say(f"  waiting for hub-a's first health poll of hub-b and hub-c (every {HEALTH_POLL_S} s)…")
    took = wait_for_health_polls(a, [b, c])
    say(f"  hub-a sees both peers and their models (after {took:.1f} s)")
    say()
    say("The pool:")
    width = max(len(h.url) for h in hubs)
    for hub in hubs:
        models = ", ".join(m.id for m in hub.models)
        say(f"  {hub.name}  {hub.url:<{width}}  pid {hub.proc.pid:<7}  simulated {hub.product} "
            f"({hub.sim.url}): {models}")
    say()
    say("  sending requests to hub-a…")
    try:
        rows = send_requests(a)
    except httpx.HTTPError as exc:
        raise DemoError(f"hub-a stopped answering the demo's requests ({type(exc).__name__}: {exc}).", a) from None
    say()
    say("Where hub-a placed them (its X-Hub-Pool-Served-By, -Backend and -Model response headers):")
    for line in table(rows):
        say(line)
    failed = [r for r in rows if not r.ok]
    for r in failed:
        say(f"  ✗ {r.request}: {r.error}")
    say()
    for line in by_hand(hubs, root):
        say(line)
    say()
    if not wait:
        return 1 if failed else 0
    say("The pool keeps running; Ctrl-C stops it.")
    while True:
        time.sleep(1)
        for hub in hubs:
            code = hub.proc.poll()
            if code is not None and not hub.exit_reported:
                hub.exit_reported = True
                say(f"{hub.name} exited with code {code}; the end of its log ({hub.log_path}):")
                say(log_tail(hub.log_path))
        if all(hub.exit_reported for hub in hubs):
            say("every node has exited.")
            return 1
