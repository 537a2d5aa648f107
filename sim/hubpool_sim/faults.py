"""Faults: the ways real engines have failed hubpool, on demand.

Each one reproduces a story from the spec — a 500 that is a verdict on the request
(2026-09-26, "no user query found in messages" from four nodes), a 200 that is not an answer
(2026-09-29, <unused49> tokens and streams without their closing frame), an engine that never
answers or drops the connection half-way. A fault can be limited to one model and to a number
of requests, after which it clears itself.

Spec string, as the CLI and ``SimServer.add_fault`` take it: ``KIND[@[MODEL][:COUNT]]`` —
"drop", "drop@:2" (any model, twice), "verdict:no-user-query@qwen3:8b:1". The count is the
last colon-part only when it is all digits, because model ids hold colons themselves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from http import HTTPStatus
from typing import Any

from hubpool_sim.flavors import Flavor

VERDICTS = ("no-user-query", "missing-messages", "invalid-message", "context-length", "chat-template")
PLAIN_KINDS = ("cut", "unused", "hang", "drop", "unauthorized", "mute", "stall", "loop")
# Only a generation has tokens to cut, garble, hold back or repeat; these never fire on
# embeddings or listings.
GENERATION_ONLY = ("cut", "unused", "mute", "stall", "loop")
#: the faults that go silent with the connection open: they end when the client hangs up
SILENT = ("mute", "stall")

# spec: the engines' own sentences, so hubpool's verdict reader is tested on what it will meet.
_VERDICT_TEXT: dict[str, dict[str, str]] = {
    "no-user-query": {
        "ollama": "no user query found in messages",
        "*": "No user query found in messages.",
    },
    "missing-messages": {
        "ollama": "messages are required",
        "llamacpp": "'messages' is required",
        "lemonade": "'messages' is required",
        "*": "messages is required",
    },
    "invalid-message": {
        "llamacpp": "Missing 'content' in message",
        "lemonade": "Missing 'content' in message",
        "*": "invalid message format",
    },
    "context-length": {
        "ollama": "the input length exceeds the context length",
        "vllm": (
            "This model's maximum context length is {window} tokens. However, you requested {requested} tokens "
            "({requested} in the messages, 0 in the completion). "
            "Please reduce the length of the messages or completion."
        ),
        "llamacpp": "the request exceeds the available context size, try increasing it",
        "lemonade": "the request exceeds the available context size, try increasing it",
        "omlx": "The prompt ({requested} tokens) exceeds this model's maximum context length ({window} tokens).",
    },
    "chat-template": {
        "ollama": 'template: :1:12: executing "" at <.Messages>: error calling index: index out of range',
        "vllm": "Error rendering chat template: jinja2.exceptions.UndefinedError: list object has no element 0",
        "*": "Error rendering chat template: list object has no element 0",
    },
}


def verdict_message(verdict: str, flavor: str, *, window: int, prompt_tokens: int) -> str:
    texts = _VERDICT_TEXT[verdict]
    text = texts.get(flavor, texts.get("*", ""))
    # A context-length refusal must claim more than the window, whatever the test sent.
    return text.format(window=window, requested=max(prompt_tokens, window + 1))


def generic_error_message(status: int) -> str:
    """A message no verdict reader should recognise: the "fails over" case."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Error"
    return f"simulated fault: HTTP {status} {reason}"


@dataclass
class Fault:
    """One armed fault. ``model`` None means any model; ``count`` None means until cleared.

    ``path`` None means the inference routes (chat, generate, completions, embeddings); a
    path arms it on exactly that route instead, listings and health probes included, so a
    test can make /health answer 503.
    """

    kind: str
    model: str | None = None
    count: int | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        if self.kind.startswith("verdict:"):
            if self.kind.removeprefix("verdict:") not in VERDICTS:
                raise ValueError(f"unknown verdict {self.kind!r}: choose one of {', '.join(VERDICTS)}")
        elif self.kind.startswith("error:"):
            status = self.kind.removeprefix("error:")
            if not status.isdigit() or not 400 <= int(status) <= 599:
                raise ValueError(f"{self.kind!r}: error faults take a 4xx or 5xx status, e.g. error:503")
        elif self.kind not in PLAIN_KINDS:
            raise ValueError(
                f"unknown fault {self.kind!r}: choose verdict:<{'|'.join(VERDICTS)}>, error:<status>, "
                f"or one of {', '.join(PLAIN_KINDS)}"
            )
        if self.count is not None:
            self.count = int(self.count)
            if self.count < 1:
                raise ValueError("a fault's count must be at least 1 (leave it out for 'until cleared')")

    @property
    def verdict(self) -> str | None:
        return self.kind.removeprefix("verdict:") if self.kind.startswith("verdict:") else None

    @property
    def status(self) -> int | None:
        return int(self.kind.removeprefix("error:")) if self.kind.startswith("error:") else None

    def matches(self, path: str, model: str | None, *, inference: bool, generation: bool) -> bool:
        if self.path is not None:
            if path != self.path:
                return False
        elif not inference:
            return False
        if self.kind in GENERATION_ONLY and not generation:
            return False
        if self.model is None:
            return True
        return model is not None and model.removesuffix(":latest") == self.model.removesuffix(":latest")

    def to_dict(self) -> dict[str, Any]:
        return {"fault": self.kind, **{k: v for k, v in asdict(self).items() if k != "kind"}}

    def __str__(self) -> str:
        suffix = ""
        if self.model is not None or self.count is not None:
            suffix = "@" + (self.model or "") + (f":{self.count}" if self.count is not None else "")
        return self.kind + suffix


def parse_fault(spec: str) -> Fault:
    """``KIND[@[MODEL][:COUNT]]`` -> Fault (see the module docstring)."""
    kind, at, rest = spec.strip().partition("@")
    model, count = None, None
    if at:
        head, colon, tail = rest.rpartition(":")
        if colon and tail.isdigit():
            model, count = head or None, int(tail)
        else:
            model = rest or None
    return Fault(kind, model=model, count=count)


def coerce_fault(item: Fault | str | dict[str, Any]) -> Fault:
    if isinstance(item, Fault):
        return item
    if isinstance(item, str):
        return parse_fault(item)
    if isinstance(item, dict):
        data = dict(item)
        kind = data.pop("fault", None) or data.pop("kind", None)
        if not kind:
            raise ValueError('a fault mapping needs "fault", e.g. {"fault": "drop", "count": 1}')
        unknown = set(data) - {"model", "count", "path"}
        if unknown:
            raise ValueError(f"unknown fault field(s): {', '.join(sorted(unknown))}")
        base = parse_fault(kind)  # "drop@m:2" works here too; explicit fields win
        return Fault(
            base.kind, model=data.get("model", base.model), count=data.get("count", base.count), path=data.get("path")
        )
    raise TypeError(f"a fault is a spec string, a mapping or a Fault, not {item!r}")


class FaultBook:
    """The armed faults, first armed first served."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        self._faults.append(fault)
        return fault

    def clear(self) -> None:
        self._faults.clear()

    def active(self) -> list[dict[str, Any]]:
        return [f.to_dict() for f in self._faults]

    def take(self, path: str, model: str | None, *, inference: bool, generation: bool) -> Fault | None:
        """The fault this request gets, counted down (and cleared at zero), or None."""
        for fault in self._faults:
            if fault.matches(path, model, inference=inference, generation=generation):
                if fault.count is not None:
                    fault.count -= 1
                    if fault.count == 0:
                        self._faults.remove(fault)
                return fault
        return None


def fault_error(
    fault: Fault, flavor: Flavor, *, native: bool, window: int, prompt_tokens: int
) -> tuple[int, dict[str, Any]] | None:
    """Status and body for a fault that answers with an error, None for the others."""
    if fault.verdict:
        message = verdict_message(fault.verdict, flavor.name, window=window, prompt_tokens=prompt_tokens)
        return 500, flavor.error_body(500, message, native=native)
    if fault.status:
        return fault.status, flavor.error_body(fault.status, generic_error_message(fault.status), native=native)
    if fault.kind == "unauthorized":
        return 401, flavor.error_body(401, flavor.unauthorized, native=native)
    return None
