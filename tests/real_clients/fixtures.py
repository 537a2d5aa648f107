"""The captured requests (tests/real_clients/data/, written by capture.py and scrub_capture.py)
and the checks that a stream is in its dialect's exact event order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
#: headers a replay leaves to its own HTTP client
TRANSPORT = {"connection", "accept-encoding"}


def load(agent: str) -> dict[str, Any]:
    return json.loads((DATA / f"{agent}.json").read_text())


def request(agent: str, model: str, **changes: Any) -> tuple[str, dict[str, str], bytes]:
    """(path, headers, body bytes) of ``agent``'s captured request, asking for ``model``;
    ``changes`` set top-level body fields."""
    fixture = load(agent)
    body = {**fixture["body"], "model": model, **changes}
    headers = {k: v for k, v in fixture["headers"].items() if k.lower() not in TRANSPORT}
    return fixture["path"], headers, json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def sse_frames(text: str) -> list[tuple[str | None, Any]]:
    """(event name or None, decoded data) per SSE frame; comment-only frames (keep-alives) skipped."""
    frames = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        event = next((line[7:].strip() for line in lines if line.startswith("event:")), None)
        data = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
        frames.append((event, data if data == "[DONE]" else json.loads(data)))
    return frames


def check_messages_stream(text: str) -> list[str]:
    """The event names of an Anthropic Messages stream, after checking its order: every frame
    with its ``event:`` line naming its data's type, message_start first, each content block
    opened before its deltas and closed after them, message_delta with output tokens, and
    message_stop last."""
    frames = sse_frames(text)
    names = []
    for event, data in frames:
        assert event is not None and isinstance(data, dict) and data.get("type") == event, (event, data)
        names.append(event)
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    assert names.count("message_start") == 1 and names.count("message_stop") == 1, names
    open_blocks: set[int] = set()
    closed: set[int] = set()
    delta_at = None
    for i, (event, data) in enumerate(frames):
        if event == "content_block_start":
            assert data["index"] not in open_blocks | closed, names
            open_blocks.add(data["index"])
        elif event == "content_block_delta":
            assert data["index"] in open_blocks, f"a delta for block {data['index']} before its start: {names}"
        elif event == "content_block_stop":
            assert data["index"] in open_blocks, names
            open_blocks.discard(data["index"])
            closed.add(data["index"])
        elif event == "message_delta":
            assert delta_at is None and not open_blocks, names
            delta_at = i
            assert data["usage"]["output_tokens"] > 0, data
    assert closed and delta_at == len(frames) - 2, names
    return names


def check_responses_stream(text: str) -> list[str]:
    """The event names of a Responses stream, after checking its order: ``event:`` naming each
    data's type, sequence numbers rising, response.created first and response.completed last
    with output tokens, each output item added before its deltas and done after them."""
    frames = sse_frames(text)
    names = []
    last_seq = -1
    for event, data in frames:
        assert event is not None and isinstance(data, dict) and data.get("type") == event, (event, data)
        names.append(event)
        if "sequence_number" in data:
            assert data["sequence_number"] > last_seq, names
            last_seq = data["sequence_number"]
    assert names[0] == "response.created" and names[-1] == "response.completed", names
    items: dict[int, str] = {}
    for event, data in frames:
        if event == "response.output_item.added":
            assert data["output_index"] not in items, names
            items[data["output_index"]] = "open"
        elif event in ("response.output_text.delta", "response.content_part.added",
                       "response.function_call_arguments.delta"):
            assert items.get(data["output_index"]) == "open", f"{event} outside its item: {names}"
        elif event == "response.output_item.done":
            assert items.get(data["output_index"]) == "open", names
            items[data["output_index"]] = "done"
    assert items and all(state == "done" for state in items.values()), names
    assert frames[-1][1]["response"]["usage"]["output_tokens"] > 0, frames[-1]
    return names


def check_chat_stream(text: str) -> list[dict[str, Any]]:
    """The chunks of a chat-completions stream, after checking its order: data-only frames,
    the assistant's role first, a finish_reason, the usage chunk (include_usage) with output
    tokens, and [DONE] last."""
    frames = sse_frames(text)
    assert frames and frames[-1] == (None, "[DONE]"), frames[-3:]
    chunks = [data for event, data in frames[:-1]]
    assert all(event is None for event, _ in frames), frames[:3]
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant", chunks[0]
    finishes = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert len(finishes) == 1, chunks
    usage = [c for c in chunks if c.get("usage")]
    assert usage and usage[-1]["usage"]["completion_tokens"] > 0 and chunks.index(usage[-1]) > chunks.index(
        finishes[0]), chunks[-3:]
    return chunks
