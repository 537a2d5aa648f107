"""Tool calls: when a simulated model answers with calls instead of text, and what they say.

A request that offers tools, and whose conversation does not end in a tool's result, is
answered with a call to each of its first two tools (two at once: parallel calls, as
agents see them); a request whose last turn is a tool's result is answered with text. The
arguments are built from each tool's JSON schema (every required property, else the first),
so a test can predict every byte. A test driving a real agent names the calls instead
(``tool_script``, hubpool_sim/script.py). A ``stall`` fault goes silent inside the first call's
arguments (:meth:`ToolCall.pieces_before_stall`). Each dialect names the same things differently:

    chat completions   tools: [{"type": "function", "function": {"name", "parameters"}}]
    messages           tools: [{"name", "input_schema"}]
    responses          tools: [{"type": "function", "name", "parameters"}]
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

MAX_PARALLEL = 2
#: how many pieces a call's JSON arguments stream in (input_json_delta, arguments deltas)
ARGUMENT_PIECES = 3


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    call_id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])

    @property
    def json(self) -> str:
        return json.dumps(self.arguments, separators=(",", ":"))

    def pieces(self) -> list[str]:
        """The arguments' JSON in ARGUMENT_PIECES parts, as an engine streams them."""
        text = self.json
        size = max(1, -(-len(text) // ARGUMENT_PIECES))
        return [text[i:i + size] for i in range(0, len(text), size)]

    def pieces_before_stall(self) -> int:
        """A ``stall`` fault in a tool-call answer goes silent inside the first call's
        arguments, after this many of its pieces: at least one, never all of them (the JSON
        is never whole), which is where a continuation cannot be sound."""
        return max(1, min(len(self.pieces()) - 1, len(self.pieces()) // 2))


def _tool_name_and_schema(tool: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    name = fn.get("name")
    schema = fn.get("parameters", fn.get("input_schema"))
    if not isinstance(name, str) or not name:
        return None
    return name, schema if isinstance(schema, dict) else {}


def _value_for(schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(kind, "tok0 tok1")


def _arguments(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    wanted = [p for p in schema.get("required") or [] if isinstance(p, str)] or list(props)[:1]
    return {name: _value_for(props.get(name)) for name in wanted}


def planned_calls(tools: Any, last_is_tool_result: bool) -> list[ToolCall]:
    """The calls a model makes for this request: none without tools or after a tool result."""
    if not isinstance(tools, list) or last_is_tool_result:
        return []
    calls = []
    for tool in tools:
        found = _tool_name_and_schema(tool)
        if found is not None:
            calls.append(ToolCall(found[0], _arguments(found[1])))
        if len(calls) == MAX_PARALLEL:
            break
    return calls


def chat_ends_in_tool_result(messages: Any) -> bool:
    """Chat completions: the last message has role "tool"."""
    return isinstance(messages, list) and bool(messages) and isinstance(messages[-1], dict) \
        and messages[-1].get("role") == "tool"
