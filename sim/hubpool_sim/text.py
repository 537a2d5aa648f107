"""Deterministic stand-ins for a model: token counts, generated words, embedding vectors.

Everything is a pure function of the request, so a test can predict every byte: prompt tokens
are ceil(UTF-8 bytes / 4) (the same estimate hubpool's placement uses), the answer is
"tok0 tok1 ...", and an embedding is a unit vector derived from a SHA-256 of the text.
"""

from __future__ import annotations

import hashlib
import math
import struct
import time
from datetime import UTC, datetime
from typing import Any

UNUSED_TOKEN = "<unused49>"


def count_tokens(text: bytes | str) -> int:
    data = text.encode() if isinstance(text, str) else text
    return math.ceil(len(data) / 4)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def messages_prompt(messages: Any) -> bytes:
    """A conversation as one byte string; a later turn extends an earlier one's prefix.

    That prefix property is what the prompt cache needs: the follow-up turn of a chat shares
    its start with the previous request, exactly as a real engine's KV cache sees it.
    """
    if not isinstance(messages, list):
        return b""
    parts = []
    for message in messages:
        if isinstance(message, dict):
            parts.append(f"{message.get('role', 'user')}: {_content_text(message.get('content'))}\n")
    return "".join(parts).encode()


def plain_prompt(prompt: Any, system: Any = None) -> bytes:
    """A completion or generate prompt (a string, or a list of them) as bytes."""
    if isinstance(prompt, list):
        prompt = "\n".join(str(p) for p in prompt)
    text = prompt if isinstance(prompt, str) else ""
    if isinstance(system, str) and system:
        text = f"{system}\n{text}"
    return text.encode()


def body_prompt(body: dict[str, Any]) -> bytes:
    """Whatever prompt a body carries, for faults that quote a token count."""
    if "messages" in body:
        return messages_prompt(body.get("messages"))
    return plain_prompt(body.get("prompt", body.get("input")), body.get("system"))


def embedding_inputs(value: Any) -> list[str]:
    """``input`` as a list of texts: a string, a list of strings, or token-id arrays."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return [" ".join(map(str, value))]
        return [v if isinstance(v, str) else " ".join(map(str, v)) if isinstance(v, list) else str(v) for v in value]
    return []


def count_or_none(value: Any) -> int | None:
    """A token count from a request (max_tokens, num_predict, num_ctx): a non-negative int, or
    None for anything else, including Ollama's -1 "no limit"."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def token_text(index: int, *, unused: bool = False) -> str:
    if unused:
        return UNUSED_TOKEN
    return f"tok{index}" if index == 0 else f" tok{index}"


def embedding(text: str, model: str, dim: int) -> list[float]:
    """A unit vector of ``dim`` floats, the same for the same model and text."""
    values: list[float] = []
    block = 0
    while len(values) < dim:
        digest = hashlib.sha256(f"{model}\0{text}\0{block}".encode()).digest()
        values.extend(v / 2**31 - 1.0 for v in struct.unpack(">8I", digest))
        block += 1
    values = values[:dim]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 6) for v in values]


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the shared start of two byte strings (bisection on slices: fast in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def rfc3339(ts: float | None = None) -> str:
    """Ollama's timestamps: UTC with a Z and nanosecond-looking precision."""
    moment = datetime.fromtimestamp(time.time() if ts is None else ts, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
