"""What the real-engine tests share: a tiny generated GGUF model, finding the cached
``llama-server`` binary, and running it as a child process on an ephemeral port.

The model is nonsense on purpose: random weights, a byte-level vocabulary and a few BPE
merges are all a router needs (it loads in well under a second and generates quickly),
and generating it here means no model file is fetched or shipped.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build_llama_server.py"

#: The id llama-server lists for the generated model (its --alias).
MODEL_ID = "tiny-llama"

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte: the alphabet a byte-level BPE vocabulary
    is spelled in (llama.cpp decodes gpt2 tokens through the inverse of this table)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def write_tiny_gguf(path: Path, *, seed: int = 1234, n_ctx_train: int = 8192) -> Path:
    """Write a llama-architecture GGUF with random f32 weights (2 layers, width 64) and a
    byte-level gpt2 vocabulary of 256 byte tokens, five merged ones and four control
    tokens. llama.cpp refuses a gpt2 vocabulary without merges. ``n_ctx_train`` is only a
    number in the header, but llama-server stops a generation there, so it is what lets a
    test keep a slot busy for seconds."""
    import gguf

    n_embd, n_layer, n_head, n_ff = 64, 2, 4, 128
    table = _byte_to_unicode()
    tokens = [table[b] for b in range(256)]
    types = [gguf.TokenType.NORMAL] * 256
    space = table[ord(" ")]
    # merges, highest priority first: " t" is the one llama.cpp insists on; the runs of t
    # let a test write a prompt of few tokens per byte (" tttttttt" is one token), so a
    # body big enough for a throughput sample still fits a small window
    merges = ["t t", "tt tt", "tttt tttt", f"{space} tttttttt", f"{space} t"]
    for merge in merges:
        tokens.append(merge.replace(" ", ""))
        types.append(gguf.TokenType.NORMAL)
    control = ["<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
    tokens += control
    types += [gguf.TokenType.CONTROL] * len(control)
    bos, eos = tokens.index("<|bos|>"), tokens.index("<|im_end|>")
    n_vocab = len(tokens)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("hubpool tiny test model")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)

    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    # numpy shapes are ggml's reversed: (out, in) is ne = [in, out]
    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, n_embd))
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _build_script() -> Any:
    spec = importlib.util.spec_from_file_location("build_llama_server", BUILD_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def find_llama_server() -> tuple[Path | None, str]:
    """(binary, where it was looked for): ``HUBPOOL_LLAMA_SERVER`` when set, else the path
    ``scripts/build_llama_server.py`` installs to."""
    env = os.environ.get("HUBPOOL_LLAMA_SERVER")
    if env:
        path = Path(env).expanduser()
        return (path if path.is_file() else None), f"HUBPOOL_LLAMA_SERVER={env}"
    path = _build_script().binary_path()
    return (path if path.is_file() else None), str(path)


def require_llama_server() -> Path:
    """The llama-server binary, or a skip naming where it was looked for and how to build it --
    a failure under CI (``CI=true``), where .ci/run builds it before pytest."""
    import pytest

    binary, where = find_llama_server()
    if binary is None:
        message = (f"llama-server not found at {where}; build it once with "
                   "`uv run python scripts/build_llama_server.py` (~12 min on 2 cores)")
        if os.environ.get("CI") == "true":
            pytest.fail(message + " -- under CI=true .ci/run must build it before pytest", pytrace=False)
        pytest.skip(message)
    return binary


def llama_cpp_version() -> str:
    """The pinned llama-cpp-python sdist the binary is built from."""
    return _build_script().LLAMA_CPP_PYTHON_VERSION


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One ``llama-server`` child process on a loopback port, serving ``model``.

    ``slots`` is ``-np``, ``ctx`` the whole ``-c`` (llama-server splits it between the
    slots), ``metrics`` adds ``--metrics``. Started by :meth:`start`, which waits for
    ``/health`` to answer 200.
    """

    def __init__(self, binary: Path, model: Path, *, slots: int = 1, ctx: int = 1024, metrics: bool = True,
                 log_dir: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        self.binary, self.model, self.slots, self.ctx = binary, model, slots, ctx
        self.extra = (("--metrics",) if metrics else ()) + tuple(extra)
        self.log_path = (log_dir or model.parent) / f"llama-server-{id(self)}.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> LlamaServer:
        """Start the server and wait until it serves; a port taken between choosing and
        binding is retried on another."""
        for _ in range(3):
            self.port = free_port()
            log = self.log_path.open("ab")
            self.proc = subprocess.Popen(
                [str(self.binary), "-m", str(self.model), "--alias", MODEL_ID, "--host", "127.0.0.1",
                 "--port", str(self.port), "-np", str(self.slots), "-c", str(self.ctx), "-t", "1",
                 "--slots", *self.extra],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            if self._wait_ready(timeout):
                return self
            self.stop()
        raise RuntimeError(f"llama-server did not become ready; its log:\n{self.log_tail()}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                if httpx.get(self.url + "/health", timeout=1, trust_env=False).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        return False

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL: the engine dies as a crashed one does, mid-whatever it was doing."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=5)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
