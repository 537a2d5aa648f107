"""What a simulated engine is: its flavor, its models, and how fast and how busy it runs.

Everything here is plain data so that a test can build it in one line, a JSON or TOML file
can hold it, and ``POST /_sim/config`` can change the speed knobs of a running server.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAVOR_NAMES = ("ollama", "vllm", "llamacpp", "lemonade", "omlx")
TEXT_KINDS = ("tokens", "prose")

# Knobs a running server may change (POST /_sim/config), with their types; the rest shape
# the engine's routes and stay put. None is allowed only where it means something.
_RUNTIME_TYPES: dict[str, Any] = {
    "slots": int, "prefill_tps": float, "decode_tps": float, "decode_ms_per_token": float, "load_ms": float,
    "tokens": int, "embedding_dim": int, "prompt_cache": bool, "timings": bool, "api_key": str,
    "time_scale": float, "sleeping": bool, "text": str, "tool_script": list,
}
RUNTIME_FIELDS = tuple(_RUNTIME_TYPES)
_NULLABLE = ("decode_ms_per_token", "api_key", "sleeping", "tool_script")

_PARAMS_TAG = re.compile(r"(?:^|[:\-_])e?(\d+(?:\.\d+)?)([bm])(?:$|[\-_])", re.IGNORECASE)


@dataclass
class SimModel:
    """One model the engine holds.

    ``window`` is its context length: what /api/show, /v1/models, /props and the
    context-size errors report. ``parameter_size`` ("8B") defaults to what the id's tag says
    ("qwen3:8b" -> "8B"), so listings look like the real thing without extra typing.
    """

    id: str
    window: int = 8192
    parameter_size: str | None = None
    embedding: bool = False
    quantization: str = "Q4_K_M"
    #: a cross-encoder: it reranks (``/v1/rerank``), and neither chats nor embeds
    reranker: bool = False

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a model needs an id")
        self.window = int(self.window)
        if self.window < 1:
            raise ValueError(f"model {self.id!r}: window must be at least 1 token")
        if self.parameter_size is None:
            match = _PARAMS_TAG.search(self.id.rsplit("/", 1)[-1])
            if match:
                self.parameter_size = f"{match.group(1)}{match.group(2).upper()}"
            else:
                self.parameter_size = "137M" if self.embedding else "3B"

    @property
    def family(self) -> str:
        match = re.match(r"[a-z]+", self.id.rsplit("/", 1)[-1].lower())
        return match.group(0) if match else "llama"

    @property
    def parameter_count(self) -> int:
        number, unit = float(self.parameter_size[:-1]), self.parameter_size[-1].upper()
        return int(number * (1e9 if unit == "B" else 1e6))

    @property
    def size(self) -> int:
        """Bytes on disk: about 0.6 bytes a parameter, which is what Q4_K_M weighs."""
        return int(self.parameter_count * 0.6)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.id.encode()).hexdigest()


def default_models() -> list[SimModel]:
    """One chat model and one embedding model: enough for every route to answer."""
    return [SimModel("llama3.2:3b", window=8192), SimModel("nomic-embed-text", window=2048, embedding=True)]


def parse_model_spec(spec: str) -> SimModel:
    """Read the CLI's ``ID[:WINDOW]``.

    Model ids carry colons themselves ("qwen3:8b"), so only an all-digit last part is a
    window: "qwen3:8b:32768" is qwen3:8b at 32768, "qwen3:8b" is qwen3:8b at the default.
    A name containing "embed" is an embedding model, the way the real catalogues name them.
    """
    model_id, window = spec, None
    head, _, tail = spec.rpartition(":")
    if head and tail.isdigit():
        model_id, window = head, int(tail)
    kwargs: dict[str, Any] = {"embedding": "embed" in model_id.lower(), "reranker": "rerank" in model_id.lower()}
    if window is not None:
        kwargs["window"] = window
    return SimModel(model_id, **kwargs)


def _coerce_model(item: SimModel | str | dict) -> SimModel:
    if isinstance(item, SimModel):
        return item
    if isinstance(item, str):
        return parse_model_spec(item)
    if isinstance(item, dict):
        return SimModel(**item)
    raise TypeError(f"a model is a SimModel, an 'ID[:WINDOW]' string or a mapping, not {item!r}")


@dataclass
class SimConfig:
    """How one simulated engine behaves. Every default is fast, so tests take milliseconds.

    Rates of 0 mean "instant". ``decode_ms_per_token``, when set (0 included), wins over
    ``decode_tps``. ``faults`` takes fault specs ("drop", "verdict:no-user-query@qwen3:8b:1"),
    mappings ({"fault": ..., "model": ..., "count": ...}) or :class:`hubpool_sim.faults.Fault`.
    ``preloaded`` lists model ids resident from the start (Ollama's /api/ps), otherwise a
    model becomes resident once it has served a request. ``time_scale`` runs the clock
    faster: every wait (load, prefill, decode) is multiplied by it, and every duration the
    engine reports (timings, Ollama's ``*_duration``) is divided by it, so a node reading
    4,000 tokens a second at ``time_scale`` 0.05 answers 20 times sooner and still reports
    4,000 (``hubpool bench pool`` replays minutes of traffic in seconds this way). ``host`` and ``port`` are used when
    the server is not given its own; a ``port`` of None means 0 (ephemeral) for
    :class:`SimServer` and the flavor's usual port for the CLI.
    """

    flavor: str = "ollama"
    host: str = "127.0.0.1"
    port: int | None = None
    models: list[SimModel] = field(default_factory=default_models)
    slots: int = 4
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    decode_ms_per_token: float | None = None
    load_ms: float = 0.0
    tokens: int = 8
    embedding_dim: int = 8
    prompt_cache: bool = True
    timings: bool = False
    api_key: str | None = None
    faults: list[Any] = field(default_factory=list)
    preloaded: list[str] = field(default_factory=list)
    keep_alive_s: float = 300.0
    version: str = "0.12.6"
    #: serve the agent dialects where the flavor does (hubpool_sim/agent.py); False is a
    #: build from before any of them
    agent_routes: bool = True
    time_scale: float = 1.0
    #: when set, every answer carries ``X-Sim-Name: <name>`` (which node served it, for a
    #: benchmark whose dispatcher does not say)
    name: str | None = None
    #: llamacpp: llama-server's router mode (``GET /models`` with each model's load status)
    router: bool = False
    #: vllm: asleep (``GET /is_sleeping``; served only with this knob set at start or later)
    sleeping: bool | None = None
    #: what an answer says: "tokens" ("tok0 tok1 …") or "prose" (words drawn from a hash of
    #: the last user message: the same answer to the same question on every engine, so a
    #: continuation elsewhere can be checked byte for byte)
    text: str = "tokens"
    #: a scripted model: the tool calls a test names, step by step, then short answers
    #: (hubpool_sim/script.py); None is the default model
    tool_script: list[dict[str, dict[str, Any]]] | None = None

    def __post_init__(self) -> None:
        if self.flavor not in FLAVOR_NAMES:
            raise ValueError(f"unknown flavor {self.flavor!r}: choose one of {', '.join(FLAVOR_NAMES)}")
        self.models = [_coerce_model(m) for m in self.models]
        if not self.models:
            raise ValueError("an engine needs at least one model")
        self.validate()

    def validate(self) -> None:
        if int(self.slots) < 1:
            raise ValueError("slots must be at least 1")
        for name in ("prefill_tps", "decode_tps", "load_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} cannot be negative")
        if not self.time_scale > 0:
            raise ValueError("time_scale must be above 0")
        if self.decode_ms_per_token is not None and self.decode_ms_per_token < 0:
            raise ValueError("decode_ms_per_token cannot be negative")
        if self.text not in TEXT_KINDS:
            raise ValueError(f"text must be one of {', '.join(TEXT_KINDS)}")
        if int(self.tokens) < 1 or int(self.embedding_dim) < 1:
            raise ValueError("tokens and embedding_dim must be at least 1")
        for step in self.tool_script or []:
            if not isinstance(step, dict) or not all(
                    isinstance(name, str) and isinstance(args, dict) for name, args in step.items()):
                raise ValueError("tool_script is a list of steps, each a mapping of tool name to its arguments")

    # -- timing -----------------------------------------------------------------------------
    @property
    def token_delay_s(self) -> float:
        if self.decode_ms_per_token is not None:
            return self.decode_ms_per_token / 1000.0
        return 1.0 / self.decode_tps if self.decode_tps > 0 else 0.0

    def prefill_s(self, tokens: int) -> float:
        return tokens / self.prefill_tps if self.prefill_tps > 0 else 0.0

    # -- models -----------------------------------------------------------------------------
    def find_model(self, name: Any) -> SimModel | None:
        """The model a request names; "x" and "x:latest" are the same model, as in Ollama."""
        if not isinstance(name, str) or not name:
            return None
        wanted = {name, name.removesuffix(":latest"), f"{name}:latest"}
        return next((m for m in self.models if m.id in wanted), None)

    # -- loading and changing ---------------------------------------------------------------
    def update(self, changes: dict[str, Any]) -> None:
        """Apply runtime changes; refuses the fields that decide which routes exist."""
        unknown = set(changes) - set(RUNTIME_FIELDS)
        if unknown:
            raise ValueError(f"cannot change {', '.join(sorted(unknown))} at runtime; "
                             f"changeable: {', '.join(RUNTIME_FIELDS)}")
        converted = {}
        for name, value in changes.items():
            if value is None and name not in _NULLABLE:
                raise ValueError(f"{name} cannot be null")
            converted[name] = None if value is None else _RUNTIME_TYPES[name](value)
        before = {name: getattr(self, name) for name in converted}
        for name, value in converted.items():
            setattr(self, name, value)
        try:
            self.validate()
        except ValueError:
            for name, value in before.items():
                setattr(self, name, value)
            raise

    def to_dict(self) -> dict[str, Any]:
        """Everything but the start-up faults: the armed ones live in the server's fault book."""
        data = dataclasses.asdict(self)
        del data["faults"]
        return data

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> SimConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(sorted(unknown))}")
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | Path) -> SimConfig:
        """A JSON or TOML file (chosen by suffix) with the same fields as this class."""
        return cls.from_mapping(read_config_file(path))


def read_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".toml":
        return tomllib.loads(text)
    return json.loads(text)
