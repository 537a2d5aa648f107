"""``hubpool-sim``: run one simulated engine until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import Any

from hubpool_sim.config import FLAVOR_NAMES, SimConfig, parse_model_spec, read_config_file
from hubpool_sim.faults import VERDICTS, parse_fault
from hubpool_sim.flavors import FLAVORS
from hubpool_sim.server import SimServer

_EPILOG = f"""\
default ports: {", ".join(f"{name} {FLAVORS[name].default_port}" for name in FLAVOR_NAMES)}

faults (--fault SPEC, SPEC = KIND[@[MODEL][:COUNT]]):
  verdict:{{{",".join(VERDICTS)}}}
                     500 with the engine's own wording of that refusal
  error:STATUS       that status with a generic (non-verdict) error body
  cut                stream ends cleanly without its final frame; non-streamed: done false / finish_reason null
  unused             the answer is <unused49> placeholders
  hang               never sends headers
  drop               sends headers and some tokens, then resets the connection
  unauthorized       401 in the engine's shape
  mute               headers and the stream's opening (a role-only chunk), then silence
  stall              headers and half the tokens, then silence with the connection open
                     (a tool-call answer: inside its first call's arguments)
  loop               one sentence repeated to the answer's length
  e.g. --fault drop   --fault error:503@:2   --fault verdict:no-user-query@qwen3:8b:1

at runtime: GET /_sim/stats, POST|DELETE /_sim/faults, POST /_sim/reset, POST /_sim/config
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hubpool-sim",
        description="Run a simulated LLM inference engine (Ollama, vLLM, llama-server, Lemonade or oMLX) "
        "for hubpool's tests, demo and benchmarks.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--flavor", choices=FLAVOR_NAMES, help="which engine to imitate (default: ollama)")
    parser.add_argument("--host", metavar="HOST", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, metavar="PORT",
                        help="port to listen on (default: the flavor's usual port; 0 picks a free one)")
    parser.add_argument(
        "--model", action="append", metavar="ID[:WINDOW]",
        help="a model to serve, with its context window (repeatable; names containing 'embed' are embedding "
        "models; default: llama3.2:3b:8192 and nomic-embed-text)",
    )
    parser.add_argument("--slots", type=int, metavar="N",
                        help="requests generating at once; the rest queue (default: 4)")
    parser.add_argument("--prefill-tps", type=float, metavar="TPS",
                        help="prompt tokens per second; 0 = instant (default)")
    parser.add_argument("--decode-tps", type=float, metavar="TPS",
                        help="generated tokens per second; 0 = instant (default)")
    parser.add_argument("--decode-ms-per-token", type=float, metavar="MS",
                        help="delay per generated token; overrides --decode-tps")
    parser.add_argument("--load-ms", type=float, metavar="MS",
                        help="delay the first request to a model not yet resident")
    parser.add_argument("--tokens", type=int, metavar="N",
                        help="tokens in an answer that sets no max_tokens / num_predict (default: 8)")
    parser.add_argument("--text", choices=("tokens", "prose"),
                        help='what answers say: "tok0 tok1 ..." (default) or prose seeded by the question')
    parser.add_argument("--embedding-dim", type=int, metavar="N", help="embedding vector length (default: 8)")
    parser.add_argument("--timings", action="store_true", default=None,
                        help="llamacpp: add llama-server's timings block")
    parser.add_argument("--no-prompt-cache", dest="prompt_cache", action="store_false", default=None,
                        help="never report cached prompt tokens")
    parser.add_argument("--api-key", metavar="KEY",
                        help="require 'Authorization: Bearer KEY' (health probes stay open)")
    parser.add_argument("--preload", action="append", metavar="ID", help="a model resident from the start (repeatable)")
    parser.add_argument("--fault", action="append", metavar="SPEC", help="arm a fault at start (repeatable; see below)")
    parser.add_argument("--config", metavar="FILE", help="JSON or TOML file with SimConfig fields; flags override it")
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    data: dict[str, Any] = read_config_file(args.config) if args.config else {}
    simple = ("flavor", "host", "port", "slots", "prefill_tps", "decode_tps", "decode_ms_per_token", "load_ms",
              "tokens", "embedding_dim", "timings", "prompt_cache", "api_key", "text")
    data.update({name: getattr(args, name) for name in simple if getattr(args, name) is not None})
    if args.model:
        data["models"] = [parse_model_spec(spec) for spec in args.model]
    if args.preload:
        data["preloaded"] = list(data.get("preloaded", [])) + args.preload
    if args.fault:
        data["faults"] = list(data.get("faults", [])) + [parse_fault(spec) for spec in args.fault]
    return SimConfig.from_mapping(data)


async def serve(config: SimConfig, host: str, port: int) -> None:
    server = await SimServer(config, host, port).start()
    models = ", ".join(m.id for m in config.models)
    print(f"hubpool-sim: {config.flavor} engine listening on {server.url} (models: {models}; slots: {config.slots})",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except (OSError, ValueError, TypeError) as exc:
        parser.error(str(exc))
    port = config.port if config.port is not None else FLAVORS[config.flavor].default_port
    try:
        asyncio.run(serve(config, config.host, port))
    except OSError as exc:
        print(f"hubpool-sim: cannot listen on {config.host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
