"""Build llama.cpp's ``llama-server`` for the real-engine tests, once, into a cache folder.

The source is the llama.cpp tree that the ``llama-cpp-python`` sdist on PyPI vendors
(``vendor/llama.cpp``): PyPI is the only source registry this project's machines and CI
reach, so the sdist is how a real llama.cpp gets here. The binary lands in
``~/.cache/hubpool/llama-server/<version>/llama-server`` (``HUBPOOL_LLAMA_SERVER_CACHE``
overrides the ``~/.cache/hubpool/llama-server`` part); a second run finds it and only
prints the path, so CI pays the ~12 minute build once per machine.

Usage: ``uv run python scripts/build_llama_server.py [--jobs N] [--force]``
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from urllib.parse import urljoin

import httpx

# Pinned so every machine builds the same engine; bump both together.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# the project-wide JSON page: some PyPI mirrors serve no per-version pages
PYPI_JSON = "https://pypi.org/pypi/llama-cpp-python/json"

CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    # static: one self-contained file in the cache, no rpath or LD_LIBRARY_PATH games
    "-DBUILD_SHARED_LIBS=OFF",
    # native tuning would make a cached binary crash on a CI machine with another CPU
    "-DGGML_NATIVE=OFF",
    "-DGGML_OPENMP=OFF",
]


class BuildError(RuntimeError):
    """A step of the build failed; the message says which and what to do."""


def cache_root() -> Path:
    """The folder that holds one sub-folder per built version."""
    env = os.environ.get("HUBPOOL_LLAMA_SERVER_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "hubpool" / "llama-server"


def binary_path(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Where the built ``llama-server`` for ``version`` lives (whether or not it exists yet)."""
    return cache_root() / version / "llama-server"


def say(msg: str) -> None:
    print(f"[build_llama_server] {msg}", flush=True)


def download_sdist(dest: Path) -> Path:
    """Fetch the pinned sdist from PyPI and check its sha256 against the pinned digest."""
    say(f"asking PyPI for llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}")
    try:
        with httpx.Client(timeout=httpx.Timeout(60.0, read=300.0), follow_redirects=True) as client:
            meta = client.get(PYPI_JSON)
            meta.raise_for_status()
            files = meta.json().get("releases", {}).get(LLAMA_CPP_PYTHON_VERSION, [])
            sdists = [u for u in files if u["packagetype"] == "sdist"]
            if not sdists:
                raise BuildError(f"PyPI lists no sdist for llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}")
            entry = sdists[0]
            # some PyPI mirrors hand back URLs relative to the JSON page
            url = urljoin(str(meta.url), entry["url"])
            target = dest / entry["filename"]
            say(f"downloading {entry['filename']} ({entry['size'] / 1e6:.1f} MB)")
            digest = hashlib.sha256()
            with client.stream("GET", url) as resp, target.open("wb") as out:
                resp.raise_for_status()
                for chunk in resp.iter_bytes(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
    except httpx.HTTPError as exc:
        raise BuildError(f"could not download the sdist from PyPI: {exc}") from exc
    if digest.hexdigest() != SDIST_SHA256:
        raise BuildError(
            f"sha256 mismatch for {target.name}: got {digest.hexdigest()}, pinned {SDIST_SHA256}"
        )
    say("sha256 verified")
    return target


def extract_llama_cpp(sdist: Path, dest: Path) -> Path:
    """Unpack only ``vendor/llama.cpp`` from the sdist and return its folder."""
    say("extracting vendor/llama.cpp")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name + "/"]
        if not members:
            raise BuildError(f"{sdist.name} has no vendor/llama.cpp folder")
        # the "data" filter refuses links and paths out of dest; Pythons before 3.11.4 lack it
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **safe)
    found = next(dest.glob("*/vendor/llama.cpp"), None)
    if found is None or not (found / "CMakeLists.txt").exists():
        raise BuildError("vendor/llama.cpp was extracted but has no CMakeLists.txt")
    return found


def run(cmd: list[str], cwd: Path) -> None:
    say("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, cwd=cwd)
    if proc.returncode != 0:
        raise BuildError(f"command failed with exit code {proc.returncode}: {' '.join(cmd)}")


def build(jobs: int, force: bool) -> Path:
    """Build and install ``llama-server`` unless the cached binary is already there."""
    target = binary_path()
    if target.exists() and not force:
        say(f"already built: {target}")
        return target
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise BuildError(f"'{tool}' is not on PATH; install cmake and a C++ compiler (apt-get install cmake g++)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hubpool-llama-build-") as tmp:
        work = Path(tmp)
        sdist = download_sdist(work)
        src = extract_llama_cpp(sdist, work / "src")
        sdist.unlink()
        build_dir = work / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        run(["cmake", "-S", str(src), "-B", str(build_dir), *generator, *CMAKE_OPTIONS], cwd=work)
        run(["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)], cwd=work)
        built = next((p for p in build_dir.rglob("llama-server") if p.is_file() and os.access(p, os.X_OK)), None)
        if built is None:
            raise BuildError("the build finished but produced no llama-server binary")
        target.parent.mkdir(parents=True, exist_ok=True)
        # copy then rename, so an interrupted install never leaves a half-written binary
        partial = target.with_suffix(".partial")
        shutil.copy2(built, partial)
        partial.replace(target)
    say(f"built in {time.monotonic() - started:.0f} s: {target}")
    return target


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: build (or find) llama-server and print its path on the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", "-j", type=int, default=2, help="parallel compile jobs (default 2)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the cached binary exists")
    parser.add_argument("--print-path", action="store_true", help="print where the binary goes and exit")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1 (got {args.jobs})")
    if args.print_path:
        print(binary_path())
        return 0
    try:
        path = build(args.jobs, args.force)
    except BuildError as exc:
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
