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


def continuation(turns: list[tuple[Any, Any]]) -> tuple[str, bytes]:
    """What a conversation asks of the answer: the text of a trailing assistant message to
    continue ("" when the last turn is not the assistant's), and the last user message's
    text, which seeds the "prose" answer (so the same question gets the same answer on every
    engine, whichever dialect carried it)."""
    continued = ""
    if turns and turns[-1][0] == "assistant":
        continued = _content_text(turns[-1][1])
    seed = next((_content_text(content) for role, content in reversed(turns) if role == "user"), "")
    return continued, seed.encode()


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


#: the "prose" text's words: common English, so an answer reads like one and never repeats
#: a span (the word after each is drawn from a hash of the seed and its position)
_WORDS = (
    "the of and to in is that it for as with was on be by this are from at or an have not which but "
    "all can more one will its about their there when so some what time into only other new these two "
    "may first any could like then than been most also through over such where after many those way "
    "well much before must between each should under never because same while last might great old "
    "year off come since against go came right used take three states himself few house use during "
    "without again place around however home small found thought went say part once general high upon "
    "school every point hand second river engine model answer pool node stream token window memory"
).split()

#: the "loop" fault's text: a short preamble, then one sentence over and over, which is what a
#: small quantised model stuck in a loop streams
LOOP_PREAMBLE = ("Let", " me", " think", " about", " this", ".")
LOOP_SENTENCE = (" The", " answer", " is", " the", " same", " as", " the", " answer", ".")


def prose_token(seed: bytes, index: int) -> str:
    """The ``index``-th word of the deterministic prose answer to ``seed``."""
    digest = hashlib.sha256(seed + index.to_bytes(4, "big")).digest()
    word = _WORDS[int.from_bytes(digest[:2], "big") % len(_WORDS)]
    if digest[2] < 20:
        word += "."
    elif digest[2] < 40:
        word += ","
    return word if index == 0 else " " + word


def loop_token(index: int) -> str:
    if index < len(LOOP_PREAMBLE):
        return LOOP_PREAMBLE[index]
    return LOOP_SENTENCE[(index - len(LOOP_PREAMBLE)) % len(LOOP_SENTENCE)]


#: the furthest a continuation is looked for in the answer (tokens)
MAX_CONTINUATION_TOKENS = 100_000


def continuation_point(prefix: str, token: Any) -> tuple[int, str]:
    """Where an answer whose tokens are ``token(i)`` continues after ``prefix`` (an
    assistant message the engine is asked to continue): the index of the first token not
    wholly in it, and what of that token is still to come ("" when the prefix ends on a
    token's edge). Engines continue a trailing assistant message rather than start a new
    one; this is what lets a test check a continuation byte for byte. A prefix that is not
    the start of the answer continues after the tokens it does match."""
    at, index = 0, 0
    while at < len(prefix) and index < MAX_CONTINUATION_TOKENS:
        piece = token(index)
        rest = prefix[at:]
        if rest.startswith(piece):
            at += len(piece)
            index += 1
            continue
        if piece.startswith(rest):  # the prefix ends inside this token
            return index, piece[len(rest):]
        break  # not this answer's text: go on after what matched
    return index, ""


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
