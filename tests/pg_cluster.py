"""A throwaway PostgreSQL cluster on loopback, from Debian's `postgresql` binaries.

Used two ways:

- ``python tests/pg_cluster.py start DIR [PORT]`` prints ``export HUBPOOL_TEST_POSTGRES_URL=...``
  (scripts/test_postgres.sh and .ci/run eval it); ``... stop DIR`` ends that cluster.
- tests that must stop and restart PostgreSQL under a running node start their own cluster with
  :class:`Cluster` so the shared one is never disturbed.

initdb and the server refuse to run as root (CI runs as root): then every binary runs as the
``postgres`` user Debian's package creates, through ``runuser``. Authentication is ``trust`` on
127.0.0.1 only and the socket directory is the cluster's own: nothing else on the box can reach
it and it needs no password.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUPERUSER = "hubpool"


def pg_bin() -> Path | None:
    """Debian's versioned binaries directory (the newest), or wherever initdb is on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def scratch_root() -> Path:
    """A fresh directory under the system temporary directory that the server's user can reach."""
    return Path(tempfile.mkdtemp(prefix="hubpool-pg-"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """``root`` must be reachable by the ``postgres`` user when running as root (pytest's own
    tmp_path is not: use :func:`scratch_root`)."""

    def __init__(self, root: Path, port: int | None = None):
        self.root = Path(root)
        self.data = self.root / "data"
        self.port = port or free_port()
        self.bin = pg_bin()
        if self.bin is None:
            raise RuntimeError("PostgreSQL's binaries are not installed (Debian: apt-get install -y postgresql)")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str, timeout: float = 60) -> None:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, timeout=timeout, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()[-800:]}")

    def init(self) -> Cluster:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                      "--no-sync", "--no-instructions")
        return self

    def start(self) -> Cluster:
        # fsync off: a throwaway test cluster; small shared buffers: a 2-core box shared with others
        opts = f"-p {self.port} -h 127.0.0.1 -k {self.root} -c fsync=off -c shared_buffers=16MB -c max_connections=60"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "server.log"),
                  "-w", "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"PostgreSQL on port {self.port} did not accept connections in {timeout}s")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("start", "stop"):
        print("usage: pg_cluster.py start DIR [PORT] | stop DIR", file=sys.stderr)
        return 2
    root = Path(argv[1]).resolve()
    if argv[0] == "stop":
        cluster = Cluster(root, port=1)
        if cluster.running():
            cluster.stop()
        return 0
    port_file = root / "port"
    if Cluster(root, port=1).running() and port_file.exists():  # already up: say where
        cluster = Cluster(root, int(port_file.read_text()))
    else:
        cluster = Cluster(root, int(argv[2]) if len(argv) > 2 else None).init().start()
        port_file.write_text(str(cluster.port))
    print(f"export HUBPOOL_TEST_POSTGRES_URL={cluster.url}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
