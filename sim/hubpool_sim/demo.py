"""`hubpool demo`: a node and two simulated engines on embedded defaults, no GPU needed.

The simulator adds this command to the hubpool CLI through the plugin hook, so the core
never imports the simulator (or names an engine)."""

from __future__ import annotations

import os
import tempfile


def run_demo(port: int) -> None:
    from hubpool_core.config import EnvSettings
    from hubpool_core.server import run_node

    from hubpool_sim import SimConfig, SimModel, run_in_thread

    data_dir = tempfile.mkdtemp(prefix="hubpool-demo-")
    ollama = SimConfig(flavor="ollama", port=0, decode_ms_per_token=20,
                       models=[SimModel("llama3.2:3b", window=8192), SimModel("nomic-embed-text", window=2048,
                                                                             embedding=True)])
    vllm = SimConfig(flavor="vllm", port=0, decode_ms_per_token=20, models=[SimModel("qwen3:8b", window=16384)])
    with run_in_thread(ollama) as sim_a, run_in_thread(vllm) as sim_b:
        for var in ("LLAMACPP_URL", "LEMONADE_URL", "OMLX_URL"):
            os.environ.setdefault(var, "http://127.0.0.1:9")  # nothing there: shows as not running
        os.environ.update({"OLLAMA_URL": sim_a.url, "VLLM_URL": sim_b.url, "HUB_POOL_DATA_DIR": data_dir,
                           "HUB_POOL_LISTEN": f"127.0.0.1:{port}"})
        base = f"http://127.0.0.1:{port}"
        print(f"""
hubpool demo: a node at {base} with two simulated engines
  simulated Ollama at {sim_a.url}  (llama3.2:3b, nomic-embed-text)
  simulated vLLM   at {sim_b.url}  (qwen3:8b)
  data directory   {data_dir}

Try, in another terminal:
  curl -s {base}/v1/models
  curl -si {base}/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{{"model": "qwen3:8b", "messages": [{{"role": "user", "content": "hello"}}]}}'
  curl -s {base}/api/chat -d '{{"model": "qwen3:8b", "messages": [{{"role": "user", "content": "hi"}}]}}'
  HUB_POOL_DATA_DIR={data_dir} HUB_POOL_LISTEN=127.0.0.1:{port} hubpool status
Ctrl-C stops everything.
""", flush=True)
        run_node(EnvSettings())
