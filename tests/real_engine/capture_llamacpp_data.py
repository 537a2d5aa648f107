"""Capture the llamacpp plugin's recorded test data from a real llama-server.

    uv run python tests/real_engine/capture_llamacpp_data.py

Starts the cached llama-server (see scripts/build_llama_server.py) on the generated tiny
model with two slots and ``--metrics``, and rewrites in plugins/llamacpp/tests/data/:
health.json, models.json, props.json, slots.json, slots_busy.json, chat_completion.json
(a repeated prompt, so it shows a cache hit), chat_stream.txt, metrics_idle.txt,
metrics_busy.txt and errors_captured.json (the refusals, with their real status), plus
CAPTURED.md naming the llama.cpp build they came from. Volatile values (ids, timestamps,
timings) are whatever the server said; the plugin's tests assert on these files.
"""

from __future__ import annotations

import datetime
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_engine.support import (  # noqa: E402 - after the path the tests use
    MODEL_ID,
    REPO,
    LlamaServer,
    find_llama_server,
    llama_cpp_version,
    write_tiny_gguf,
)

DATA = REPO / "plugins" / "llamacpp" / "tests" / "data"
PROMPT = [{"role": "system", "content": "You answer briefly."},
          {"role": "user", "content": "What is the capital of France? " * 8}]


def dump_json(name: str, body) -> None:
    (DATA / name).write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {name}")


def long_generation(url: str, stop: threading.Event) -> None:
    body = {"model": MODEL_ID, "messages": PROMPT, "stream": True, "max_tokens": 4000, "ignore_eos": True}
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            for _ in r.iter_raw():
                if stop.is_set():
                    return
    except httpx.HTTPError:
        return


def main() -> int:
    binary, where = find_llama_server()
    if binary is None:
        print(f"no llama-server at {where}; run `uv run python scripts/build_llama_server.py` first")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_gguf(Path(tmp) / "tiny-llama.gguf")
        with LlamaServer(binary, model, slots=2, ctx=2048, log_dir=Path(tmp)) as server:
            url = server.url
            with httpx.Client(base_url=url, timeout=30, trust_env=False) as c:
                dump_json("health.json", c.get("/health").json())
                dump_json("models.json", c.get("/v1/models").json())
                props = c.get("/props").json()
                dump_json("props.json", props)
                dump_json("slots.json", c.get("/slots").json())
                (DATA / "metrics_idle.txt").write_text(c.get("/metrics").text)
                print("wrote metrics_idle.txt")

                chat = {"model": MODEL_ID, "messages": PROMPT, "max_tokens": 4, "temperature": 0}
                c.post("/v1/chat/completions", json=chat).raise_for_status()  # fills the prompt cache
                dump_json("chat_completion.json", c.post("/v1/chat/completions", json=chat).json())
                stream = c.post("/v1/chat/completions", json={**chat, "stream": True})
                (DATA / "chat_stream.txt").write_text(stream.text)
                print("wrote chat_stream.txt")

                errors = []
                too_long = {"model": MODEL_ID, "messages": [{"role": "user", "content": "abc " * 600}]}
                r = c.post("/v1/chat/completions", json=too_long)
                errors.append({"signature": "context-length", "status": r.status_code, "body": r.json()})
                r = c.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": [{"role": "user"}]})
                errors.append({"signature": "invalid-message", "status": r.status_code, "body": r.json()})
                dump_json("errors_captured.json", errors)

                # three long generations into two slots: two processing, one deferred
                stop = threading.Event()
                threads = [threading.Thread(target=long_generation, args=(url, stop), daemon=True)
                           for _ in range(3)]
                for t in threads:
                    t.start()
                deadline = time.monotonic() + 10
                text = ""
                while time.monotonic() < deadline:
                    text = c.get("/metrics").text
                    if "llamacpp:requests_deferred 1" in text and "llamacpp:requests_processing 2" in text:
                        break
                    time.sleep(0.05)
                (DATA / "metrics_busy.txt").write_text(text)
                print("wrote metrics_busy.txt")
                dump_json("slots_busy.json", c.get("/slots").json())
                stop.set()
                for t in threads:
                    t.join(timeout=10)

    today = datetime.date.today().isoformat()
    (DATA / "CAPTURED.md").write_text(
        "# Where this data came from\n\n"
        "Captured from a real llama-server by `tests/real_engine/capture_llamacpp_data.py` on "
        f"{today}: llama.cpp vendored by llama-cpp-python {llama_cpp_version()} "
        f"(`/props` build_info `{props.get('build_info')}`), built by `scripts/build_llama_server.py`, "
        "serving the generated tiny model (`--alias tiny-llama`, `-np 2 -c 2048 --metrics`).\n\n"
        "Captured: health.json, models.json, props.json, slots.json, slots_busy.json, "
        "chat_completion.json, chat_stream.txt, metrics_idle.txt, metrics_busy.txt, "
        "errors_captured.json.\n"
        "Not captured here, kept from before: "
        "health_loading.json (the tiny model loads too fast to catch) and errors.json "
        "(one body for every request-error signature, as a 500; today's build answers the two it "
        "was asked with 400, see errors_captured.json).\n"
    )
    print("wrote CAPTURED.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
