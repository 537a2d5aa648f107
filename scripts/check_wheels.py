"""Install hubpool from its wheels alone, outside the source tree, and route one request.

What a new box does, checked end to end (issue 19, item 1; `.ci/run` runs it):

1. `uv build --all-packages`: every distribution of the workspace (hubpool, each plugin, the
   engine simulator) builds to a wheel and an sdist;
2. a fresh virtual environment in a temporary directory, outside the workspace, gets only those
   wheels with `pip install` (their third-party dependencies come from the package index);
3. from that environment, with the temporary directory as working directory: `hubpool --version`
   names every distribution at its version, `hubpool plugins --json` finds every first-party
   plugin active through its entry point, and hubpool_core is imported from the environment,
   never the checkout; `hubpool service install --dry-run` would run that environment's hubpool;
4. `hubpool-sim` (a simulated engine) and `hubpool serve` start from that environment, and a
   chat completion sent to the node comes back routed (200, an answer, the routing headers), and
   the web UI's files (templates, scripts, the vendored chart library) are served from the wheel;
5. with `--uv-tool`, the same wheels through `uv tool install`, and `hubpool --version` from it.

Each step prints one line with its time; a failure prints what it saw and exits non-zero.
    uv run python scripts/check_wheels.py [--dist DIR] [--keep] [--uv-tool]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "llama3.2:3b"
#: engine URL variables the first-party engine plugins read; all but the simulated one point at
#: a closed port so the node never reaches an engine that happens to run on this machine
ENGINE_VARS = ("OLLAMA_URL", "VLLM_URL", "LLAMACPP_URL", "LEMONADE_URL", "OMLX_URL")


class CheckFailed(Exception):
    pass


def workspace_distributions() -> dict[str, dict[str, Any]]:
    """{distribution name: {"version", "plugins": [entry-point names]}} for the root project and
    every workspace member (read from their pyproject.toml files, not from an installed env)."""
    files = [ROOT / "pyproject.toml", *sorted((ROOT / "plugins").glob("*/pyproject.toml")),
             ROOT / "sim" / "pyproject.toml"]
    out: dict[str, dict[str, Any]] = {}
    for path in files:
        project = tomllib.loads(path.read_text())["project"]
        eps = project.get("entry-points", {}).get("hubpool.plugins", {})
        out[project["name"]] = {"version": project["version"], "plugins": sorted(eps)}
    return out


def normalized(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> str:
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"`{' '.join(cmd)}` did not finish within {timeout:.0f}s") from exc
    if r.returncode != 0:
        raise CheckFailed(f"`{' '.join(cmd)}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def clean_env(work: Path) -> dict[str, str]:
    """The caller's environment without anything that points into the workspace's own venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT")
           and not k.startswith("HUB_POOL_") and k not in ENGINE_VARS}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["HOME"] = str(work / "home")  # a new user's home: no leftover ~/.hubpool
    (work / "home").mkdir(exist_ok=True)
    return env


def http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise CheckFailed(f"{proc.args} exited {proc.returncode} during start:\n{log.read_text()[-3000:]}")
        try:
            if http("GET", url, timeout=1.0)[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise CheckFailed(f"{url} did not answer within {timeout:.0f}s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


class Steps:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def done(self, what: str, started: float) -> None:
        print(f"[wheels] {what} ok ({time.monotonic() - started:.1f}s)", flush=True)


def check(dist: Path | None, work: Path, uv_tool: bool) -> None:
    steps = Steps()
    expected = workspace_distributions()
    env = clean_env(work)

    t = time.monotonic()
    if dist is None:
        dist = work / "dist"
        run(["uv", "build", "--all-packages", "--out-dir", str(dist)], cwd=ROOT, env={**os.environ}, timeout=600)
    names = [p.name for p in dist.iterdir()]
    for name, info in expected.items():
        stem = f"{normalized(name)}-{info['version']}"
        if f"{stem}-py3-none-any.whl" not in names or f"{stem}.tar.gz" not in names:
            raise CheckFailed(f"{name} {info['version']} has no wheel and sdist in {dist}: {sorted(names)}")
    steps.done(f"build: {len(expected)} distributions, a wheel and an sdist each", t)

    t = time.monotonic()
    venv = work / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=work, env=env, timeout=120)
    wheels = sorted(str(p) for p in dist.glob("*.whl"))
    # --find-links: the wheels depend on each other by name (hubpool on hubpool-ollama ...)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--find-links", str(dist), *wheels],
        cwd=work, env=env, timeout=600)
    # `hubpool serve` re-executes itself under `python -OO` (hubpool_core/cli/main.py), which reads
    # .opt-2.pyc files that pip does not write; docs/deploy.md compiles them once, as here
    run([str(venv / "bin" / "python"), "-OO", "-m", "compileall", "-q", str(venv / "lib")], cwd=work, env=env,
        timeout=600)
    steps.done(f"pip install of the {len(wheels)} wheels into a fresh venv at {venv}", t)

    t = time.monotonic()
    where = run([str(venv / "bin" / "python"), "-c", "import hubpool_core; print(hubpool_core.__file__)"],
                cwd=work, env=env, timeout=60).strip()
    if not Path(where).resolve().is_relative_to(venv.resolve()):
        raise CheckFailed(f"hubpool_core was imported from {where}, not from the fresh environment")
    hubpool = str(venv / "bin" / "hubpool")
    text = run([hubpool, "--version"], cwd=work, env=env, timeout=60)
    check_version_text(text, expected)
    plugin_env = {**env, "HUB_POOL_DATA_DIR": str(work / "data")}
    listed = {r["name"]: r for r in json.loads(run([hubpool, "plugins", "--json"], cwd=work, env=plugin_env,
                                                    timeout=60))["plugins"]}
    for name, info in expected.items():
        for plugin in info["plugins"]:
            row = listed.get(plugin)
            if row is None or not row["active"] or row["distribution"] != name:
                raise CheckFailed(f"plugin {plugin} of {name} is not active from the wheels: {row}")
    count = sum(len(i["plugins"]) for i in expected.values())
    steps.done(f"`hubpool --version` names {len(expected)} distributions; {count} plugins active by entry point", t)

    t = time.monotonic()
    # the service this box would install runs this environment's own hubpool, not a checkout's
    unit = run([hubpool, "service", "install", "--user", "--dry-run", "--platform", "linux"], cwd=work,
               env=plugin_env, timeout=60)
    if f"ExecStart={venv / 'bin' / 'hubpool'} serve" not in unit:
        raise CheckFailed(f"`hubpool service install --dry-run` does not run this environment's hubpool:\n{unit}")
    steps.done("`hubpool service install --dry-run` names the fresh venv's hubpool", t)

    t = time.monotonic()
    serve_and_route(venv, work, env)
    steps.done("`hubpool serve` from the fresh venv answered a routed chat completion", t)

    if uv_tool:
        t = time.monotonic()
        tool_env = {**env, "UV_TOOL_DIR": str(work / "uv-tools"), "UV_TOOL_BIN_DIR": str(work / "uv-bin")}
        core = next(w for w in wheels if Path(w).name.startswith("hubpool-"))
        withs = [arg for w in wheels if w != core for arg in ("--with", w)]
        run(["uv", "tool", "install", "--find-links", str(dist), core, *withs], cwd=work, env=tool_env, timeout=600)
        check_version_text(run([str(work / "uv-bin" / "hubpool"), "--version"], cwd=work, env=env, timeout=60),
                           expected)
        steps.done("`uv tool install` of the wheels gives the same `hubpool --version`", t)
    print(f"[wheels] all checks passed in {time.monotonic() - steps.t0:.1f}s", flush=True)


def check_version_text(text: str, expected: dict[str, dict[str, Any]]) -> None:
    seen = dict(line.split() for line in text.splitlines() if line.strip())
    want = {name: info["version"] for name, info in expected.items()}
    if seen != want:
        raise CheckFailed(f"`hubpool --version` printed\n{text}\nexpected every distribution: {want}")


def serve_and_route(venv: Path, work: Path, env: dict[str, str]) -> None:
    sim_port, node_port, dead_port = free_port(), free_port(), free_port()
    sim_log, node_log = work / "sim.log", work / "node.log"
    procs: list[subprocess.Popen] = []
    try:
        with sim_log.open("w") as out:
            procs.append(subprocess.Popen([str(venv / "bin" / "hubpool-sim"), "--flavor", "ollama", "--port",
                                           str(sim_port), "--model", f"{MODEL}:8192"], cwd=work, env=env,
                                          stdout=out, stderr=subprocess.STDOUT))
        wait_http(f"http://127.0.0.1:{sim_port}/_sim/stats", procs[0], sim_log, 30)
        node_env = {**env, **{var: f"http://127.0.0.1:{dead_port}" for var in ENGINE_VARS},
                    "OLLAMA_URL": f"http://127.0.0.1:{sim_port}", "HUB_POOL_DATA_DIR": str(work / "data"),
                    "HUB_POOL_TAILSCALE_CLI": "/nonexistent/tailscale"}
        with node_log.open("w") as out:
            procs.append(subprocess.Popen([str(venv / "bin" / "hubpool"), "serve", "--listen",
                                           f"127.0.0.1:{node_port}"], cwd=work, env=node_env, stdout=out,
                                          stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{node_port}"
        t0 = time.monotonic()
        wait_http(base + "/api/inference/pool/identify", procs[1], node_log, 60)
        print(f"[wheels]   the node answered {time.monotonic() - t0:.1f}s after its start", flush=True)
        tries = 0
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello from the wheels."}]}
        deadline = time.monotonic() + 30  # the first probe of the engine may still be in flight
        while True:
            status, headers, raw = http("POST", base + "/v1/chat/completions", body, timeout=30)
            tries += 1
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if status != 200:
            raise CheckFailed(f"chat completion got {status}: {raw[:500]!r}\n{node_log.read_text()[-3000:]}")
        answer = json.loads(raw)["choices"][0]["message"]["content"]
        lower = {k.lower(): v for k, v in headers.items()}
        if not answer or not lower.get("x-hub-pool-request-id") or not lower.get("x-hub-pool-served-by"):
            raise CheckFailed(f"the answer was not routed: headers {headers}, answer {answer!r}")
        print(f"[wheels]   served by {lower['x-hub-pool-served-by']} (try {tries}): {answer[:60]!r}", flush=True)
        # package data ships too: the web UI's pages need their templates, scripts and vendored charts
        for path in ("/", "/ui/static/charts.js", "/ui/static/vendor/uplot/uPlot.iife.min.js"):
            status, _, _ = http("GET", base + path)
            if status != 200:
                raise CheckFailed(f"GET {path} answered {status} from the wheel-installed node")
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, help="use wheels already built in DIR (default: build them)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (it is printed)")
    parser.add_argument("--uv-tool", action="store_true", help="also install with `uv tool install`")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="hubpool-wheels-")).resolve()
    if work.is_relative_to(ROOT):
        print(f"[wheels] the temporary directory {work} is inside the workspace; set TMPDIR elsewhere",
              file=sys.stderr)
        return 2
    print(f"[wheels] working in {work}", flush=True)
    try:
        check(args.dist.resolve() if args.dist else None, work, args.uv_tool)
    except CheckFailed as exc:
        print(f"[wheels] FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
