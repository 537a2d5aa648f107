"""Write tests/data/upgrade/<release>/: a data directory and SQLite database as a previous
release leaves them, for tests/test_upgrade.py.

Run it from a checkout of the previous release (its own environment), naming the output:

    git worktree add /tmp/old <commit> && cd /tmp/old && uv sync --all-packages
    uv run python /path/to/hubpool/scripts/make_upgrade_fixture.py /path/to/hubpool/tests/data/upgrade/<name>

Two nodes of that release pair (signed both ways), hub-a mints an inference API key, both
stop cleanly; hub-a's data directory (database, node secret, operator key, settings, nonce
file) is kept with expected.json, what the upgraded node must still show.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "tests"))  # the old release's own harness

from harness import make_pool, name_of, pair  # noqa: E402

KEEP = ("hubpool.db", "node.secret", "operator.key", "settings.json", "nonces.json")


def main(out: Path) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        nodes = make_pool(Path(tmp), ["hub-a", "hub-b"])
        for n in nodes.values():
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        pair(a, b)
        for _ in range(2):  # the second round: both sides sign
            for n in (a, b):
                n.run(n.node.health.poll_once())
        _row, key = a.node.keys.create("fleet-ci", "inference")
        with a.client(headers=a.headers()) as c:
            status = c.get("/api/inference/pool/status").json()
        for n in nodes.values():
            n.stop()
        out.mkdir(parents=True, exist_ok=True)
        data = out / "data"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir()
        src = Path(tmp) / "hub-a"
        for name in sorted(p.name for p in src.iterdir()):
            if name in KEEP or name.startswith("nonce"):
                shutil.copy2(src / name, data / name)
        leftovers = sorted(p.name for p in data.iterdir() if p.name.endswith(("-wal", "-shm")))
        assert not leftovers, f"the database was not checkpointed: {leftovers}"
        expected = {
            "release": commit,
            "nodeFqdn": name_of(a),
            "nodeUuid": status["localNode"]["identity"]["nodeUuid"],
            "publicKeyFingerprint": status["localNode"]["identity"]["publicKeyFingerprint"],
            "peers": [{"nodeFqdn": p["nodeFqdn"], "status": p["status"], "authMode": p["authMode"]}
                      for p in status["peers"]],
            "operatorKey": a.operator_key,
            "inferenceKey": key,
            "schemaRevision": "0001",
            "files": sorted(p.name for p in data.iterdir()),
        }
        (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
        print(json.dumps(expected, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
